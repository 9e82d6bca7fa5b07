// flash4 errors: one exception type for C++ callers, status codes for the C API.
#pragma once

#include <stdexcept>
#include <string>

namespace flash4 {

enum class Status : int {
  kOk = 0,
  kInvalidArgument = 1,  // a bad shape, dtype, stride, pointer or value; the message names the argument
  kNotSupported = 2,     // valid input that the chosen device cannot run (see can_implement)
  kCudaError = 3,        // the CUDA runtime reported an error
  kInternal = 4,
};
const char* status_name(Status s);

class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  Status status() const { return status_; }

 private:
  Status status_;
};

}  // namespace flash4
