// libFuzzer target for `flash4 run`'s option parser (fuzz/README.md). The input is split at NUL bytes into
// arguments; parse_run_options must accept them or throw std::invalid_argument. Accepted options then go the way
// run_attention takes them before allocating: views of the parsed sizes, validation without buffers, the memory
// estimate and (for small sizes) the FLOP count. Any other exception, a crash or a sanitizer report is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "flash4/api.h"
#include "flops.h"
#include "memory_budget.h"
#include "options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args(1);
  for (size_t i = 0; i < size && args.size() <= 64; ++i) {
    if (data[i] == 0) args.emplace_back();
    else args.back().push_back(static_cast<char>(data[i]));
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  flash4_cli::RunOptions o;
  try {
    o = flash4_cli::parse_run_options(static_cast<int>(args.size()), argv.data());
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).empty()) std::abort();
    return 0;
  }
  if (o.iters < 1 || o.iters > flash4_cli::kMaxIters) std::abort();  // the bound the run's loop relies on

  const flash4::Device cpu = flash4::Device::cpu();
  flash4::ForwardArgs f;
  f.q = flash4::make_view(nullptr, o.dtype, cpu, o.batch, o.seqlen_q, o.heads, o.head_dim);
  f.k = flash4::make_view(nullptr, o.dtype, cpu, o.batch, o.seqlen_k, o.heads_kv, o.head_dim);
  f.v = f.k;
  f.out = f.q;
  f.lse = flash4::make_view(nullptr, flash4::DType::kFloat32, cpu, o.batch, o.heads, o.seqlen_q);
  f.causal = o.causal;
  f.window_left = o.window_left;
  f.window_right = o.window_right;
  f.softcap = o.softcap;
  f.tuning.exp2 = o.exp2;
  try {
    (void)flash4::can_implement(f, flash4::Validation::kWithoutBuffers);
  } catch (const flash4::Error& e) {
    if (e.status() != flash4::Status::kInvalidArgument) std::abort();
    return 0;
  }
  const flash4_cli::MemoryNeed need = flash4_cli::estimate_memory(o, /*on_cuda=*/true);
  if (!(need.host_bytes >= 0) || !(need.device_bytes >= 0)) std::abort();
  if (o.seqlen_q <= (1 << 16)) {
    const double flops = flash4_cli::attention_flops(f, o.backward);
    if (!(flops >= 0)) std::abort();
  }
  return 0;
}
