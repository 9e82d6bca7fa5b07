// The building blocks of argument validation (src/api/validate*.cpp): an entry point's error reporter and the
// checks of one tensor or a pair of tensors. Every failure throws Error(kInvalidArgument) with a message that
// starts with the entry point and names the argument.
#pragma once

#include <cstdint>
#include <string>

#include "common/problem.h"
#include "flash4/error.h"
#include "flash4/types.h"

namespace flash4::detail {

// Collects the calling entry point's name so every message starts with it, and whether the buffers (data
// pointers, aliasing, host-resident sequence offsets) are checked too or only the shapes and values
// (Validation::kWithoutBuffers).
class Checker {
 public:
  explicit Checker(const char* entry_point, bool buffers = true) : entry_point_(entry_point), buffers_(buffers) {}

  [[noreturn]] void fail(const std::string& message) const {
    throw Error(Status::kInvalidArgument, std::string(entry_point_) + ": " + message);
  }
  bool buffers() const { return buffers_; }

 private:
  const char* entry_point_;
  bool buffers_;
};

// REQUIRE(checker, condition, message): the message (string concatenations, to_string) is built only when the
// condition fails. Built eagerly on every call, the messages cost 12 us per backward and 6 us per forward call on
// the host (tiny problems, CPU build machine): more than a kernel launch.
#define FLASH4_REQUIRE(checker, condition, message) \
  do {                                              \
    if (!(condition)) (checker).fail(message);      \
  } while (0)

// Checks one tensor on its own: rank, dtype and device values, sizes, strides, pointer, and that its byte
// extent fits in int64. `dims` names the dimensions for messages (rank entries).
void check_tensor(const Checker& c, const TensorView& t, const char* name, int rank, const char* const* dims);

// "name.shape[i] (dim)", for messages.
std::string dim_label(const char* tensor, int i, const char* const* dims);

void check_same_device(const Checker& c, const TensorView& t, const char* name, const TensorView& like,
                       const char* like_name);

// Outputs must not share bytes with inputs or other outputs (conservative: intersecting byte ranges fail).
void check_no_overlap(const Checker& c, const TensorView& out, const char* out_name, const TensorView& other,
                      const char* other_name);

// Two tensors the library writes (the KV caches of an append) must not share an element; interleaved views of
// one buffer do not. Exact for tensors of one dtype and equal strides; others whose byte ranges meet are refused.
void check_no_shared_elements(const Checker& c, const TensorView& a, const char* a_name, const TensorView& b,
                              const char* b_name);

// An output's elements must be distinct: no dimension of size > 1 with stride 0 (a broadcast view), whose
// writes would race (the check torch makes; other self-overlapping strides are not looked for). An empty
// output passes.
void check_distinct_elements(const Checker& c, const TensorView& out, const char* name);

// An optional tensor is absent when its pointer is null and its shape is all zeros (a default TensorView).
bool present(const TensorView& t);

// A float scalar for messages, in %g form: std::to_string's fixed six decimals print -1e-10 as "-0.000000".
std::string number_text(double x);

// The score and mask options of every entry point (forward, backward, KV cache), checked and resolved into p
// (whose head_dim is set): softmax_scale (0 = 1/sqrt(head_dim)), softcap (0 = off), causal (bottom-right: the
// window's right side at most 0) and the window (-1 = unbounded side).
struct ScoreOptions {
  float softmax_scale = 0.0f, softcap = 0.0f;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
};
void check_score_options(const Checker& c, const ScoreOptions& o, Problem& p);

// The score transform's float32 factors (softmax_scale * log2(e) without softcap; softcap * log2(e) and
// softmax_scale / softcap with it) must be finite: an infinite factor makes even finite scores NaN.
// softmax_scale is the resolved one (never 0).
void check_score_factors(const Checker& c, float softmax_scale, float softcap);

}  // namespace flash4::detail
