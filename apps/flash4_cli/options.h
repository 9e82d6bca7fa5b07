// Options of `flash4 run`, parsed from the command line.
#pragma once

#include <cstdint>
#include <string>

#include "flash4/api.h"

namespace flash4_cli {

// Upper bound of --iters: a bound that keeps the timing vector small and the count in an int.
constexpr int64_t kMaxIters = 1000000;

struct RunOptions {
  int64_t batch = 1;
  int64_t seqlen_q = 1024;
  int64_t seqlen_k = -1;  // -1: same as seqlen_q
  int64_t heads = 16;
  int64_t heads_kv = -1;  // -1: same as heads
  int64_t head_dim = 128;
  flash4::DType dtype = flash4::DType::kBFloat16;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool backward = false;
  std::string device = "auto";  // auto | cpu | cuda
  bool check = false;
  int iters = 10;
  uint64_t seed = 0;
  flash4::Exp2Mode exp2 = flash4::Exp2Mode::kAuto;
  bool conditional_rescale = true;
};

// Parses the arguments after `run`; throws std::invalid_argument with a message for the user.
RunOptions parse_run_options(int argc, char** argv);

// The full `flash4 --help` text.
const char* help_text();

}  // namespace flash4_cli
