// Parsing of `flash4 run` options: `--name value` or `--name=value`, every value checked.
#include "options.h"

#include <charconv>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

namespace flash4_cli {
namespace {

[[noreturn]] void bad(const std::string& message) { throw std::invalid_argument(message); }

template <typename T>
T parse_number(std::string_view flag, std::string_view text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range && end == text.data() + text.size())
    bad(std::string(flag) + ": " + std::string(text) + " is out of range");
  if (ec != std::errc() || end != text.data() + text.size())
    bad(std::string(flag) + ": expected a number, got '" + std::string(text) + "'");
  return value;
}

// An integer in [min, max]; parsed as int64 so that a value beyond `max` is reported, never narrowed.
int64_t parse_size(std::string_view flag, std::string_view text, int64_t min,
                   int64_t max = std::numeric_limits<int64_t>::max()) {
  const auto value = parse_number<int64_t>(flag, text);
  if (value < min || value > max) {
    bad(std::string(flag) + " must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " +
        std::string(text));
  }
  return value;
}

flash4::DType parse_dtype(std::string_view text) {
  if (text == "bf16") return flash4::DType::kBFloat16;
  if (text == "fp16") return flash4::DType::kFloat16;
  if (text == "fp32") return flash4::DType::kFloat32;
  if (text == "fp8") return flash4::DType::kFloat8E4M3;
  bad("--dtype: expected bf16, fp16, fp32 or fp8, got '" + std::string(text) + "'");
}

flash4::Exp2Mode parse_exp2(std::string_view text) {
  if (text == "auto") return flash4::Exp2Mode::kAuto;
  if (text == "exact") return flash4::Exp2Mode::kExact;
  if (text == "poly") return flash4::Exp2Mode::kPolynomial;
  bad("--exp2: expected auto, exact or poly, got '" + std::string(text) + "'");
}

void parse_window(std::string_view text, RunOptions& o) {
  const size_t comma = text.find(',');
  if (comma == std::string_view::npos) bad("--window: expected L,R (e.g. 256,0; -1 = unbounded), got '" +
                                           std::string(text) + "'");
  o.window_left = parse_number<int>("--window", text.substr(0, comma));
  o.window_right = parse_number<int>("--window", text.substr(comma + 1));
}

}  // namespace

RunOptions parse_run_options(int argc, char** argv) {
  RunOptions o;
  for (int i = 0; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view value;
    bool has_inline_value = false;
    if (const size_t eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline_value = true;
    }
    // Fetches the value of a flag that takes one.
    auto next = [&]() -> std::string_view {
      if (has_inline_value) return value;
      if (i + 1 >= argc) bad(std::string(arg) + " needs a value");
      return argv[++i];
    };
    auto no_value = [&] {
      if (has_inline_value) bad(std::string(arg) + " takes no value");
    };

    if (arg == "--batch") o.batch = parse_size(arg, next(), 0);
    else if (arg == "--seqlen-q") o.seqlen_q = parse_size(arg, next(), 0);
    else if (arg == "--seqlen-k") o.seqlen_k = parse_size(arg, next(), 0);
    else if (arg == "--seqlen") o.seqlen_q = o.seqlen_k = parse_size(arg, next(), 0);
    else if (arg == "--heads") o.heads = parse_size(arg, next(), 1);
    else if (arg == "--heads-kv") o.heads_kv = parse_size(arg, next(), 1);
    else if (arg == "--head-dim") o.head_dim = parse_size(arg, next(), 1);
    else if (arg == "--dtype") o.dtype = parse_dtype(next());
    else if (arg == "--causal") { no_value(); o.causal = true; }
    else if (arg == "--window") parse_window(next(), o);
    else if (arg == "--softcap") o.softcap = parse_number<float>(arg, next());
    else if (arg == "--backward") { no_value(); o.backward = true; }
    else if (arg == "--device") {
      o.device = std::string(next());
      if (o.device != "auto" && o.device != "cpu" && o.device != "cuda")
        bad("--device: expected auto, cpu or cuda, got '" + o.device + "'");
    }
    else if (arg == "--check") { no_value(); o.check = true; }
    else if (arg == "--iters") o.iters = static_cast<int>(parse_size(arg, next(), 1, kMaxIters));
    else if (arg == "--seed") o.seed = parse_number<uint64_t>(arg, next());
    else if (arg == "--exp2") o.exp2 = parse_exp2(next());
    else if (arg == "--no-conditional-rescale") { no_value(); o.conditional_rescale = false; }
    else bad("unknown option '" + std::string(argv[i]) + "'");
  }
  if (o.seqlen_k < 0) o.seqlen_k = o.seqlen_q;
  if (o.heads_kv < 0) o.heads_kv = o.heads;
  // The forward's tuning knobs would only change the forward that prepares out and lse, never the timed backward.
  if (o.backward && o.exp2 != flash4::Exp2Mode::kAuto)
    bad("--exp2 applies to the forward only; drop it with --backward");
  if (o.backward && !o.conditional_rescale)
    bad("--no-conditional-rescale applies to the forward only; drop it with --backward");
  if (o.backward && o.dtype == flash4::DType::kFloat8E4M3)
    bad("--dtype fp8 runs the forward only (there is no FP8 backward); drop --backward");
  return o;
}

const char* help_text() {
  return R"(flash4 - FlashAttention-4 in C++ (Hopper GPUs, with a CPU path)

Usage:
  flash4 run [options]     run attention on random normal inputs, time it, optionally check it
  flash4 --help            this text
  flash4 --version         the library version

Shape (layout q: (batch, seqlen_q, heads, head_dim), k/v: (batch, seqlen_k, heads_kv, head_dim)):
  --batch B                batch size (default 1)
  --seqlen-q S             query length (default 1024)
  --seqlen-k S             key/value length (default: seqlen-q)
  --seqlen S               sets both lengths
  --heads H                query heads (default 16)
  --heads-kv H             key/value heads; heads must be a multiple (GQA/MQA) (default: heads)
  --head-dim D             head dimension, a multiple of 8 up to 256 (default 128)
  --dtype bf16|fp16|fp32|fp8
                           element type of q, k, v, out and gradients (default bf16); fp8: q, k, v
                           float8_e4m3fn (N(0, 1) inputs rounded to E4M3, descale 1), out bf16, forward only

Attention:
  --causal                 causal mask, aligned bottom-right (query i sees key j <= i + seqlen_k - seqlen_q)
  --window L,R             sliding window: keys within L before and R after the diagonal; -1 = unbounded
  --softcap C              score = C * tanh(score / C); 0 = off (default)
  --backward               time the backward pass (dq, dk, dv) instead of the forward pass

Execution:
  --device auto|cpu|cuda   auto uses a supported CUDA GPU (sm_90) when present, else the CPU (default auto)
  --iters N                timed runs after one warm-up, 1 to 1000000; the median is reported (default 10)
  --seed N                 seed of the random inputs (default 0)
  --exp2 auto|exact|poly   how the forward's softmax evaluates exp2: the backend's choice, MUFU / CPU exp2, or FA4's
                           FMA-pipe polynomial (default auto; forward only)
  --no-conditional-rescale rescale the output on every new row maximum instead of FA4's lazy rescaling
                           (forward only)

Checking:
  --check                  compare with a naive fp64 reference. Large forward problems are checked on 64
                           sampled query rows per (batch, head); large backward problems on batch 0 and the
                           first group of heads that share a key/value head. Passes when
                             max error <= 2 x (max error of a naive same-dtype attention) + atol,
                           for out and lse (forward) or dq, dk and dv (backward), with atol = one ulp of the
                           dtype at 0.3 + 1e-4 x max |reference|. Exit code 1 on FAIL. A backward problem too
                           large for the fp64 reference is refused before it runs (exit 2).

Output: the configuration, the median time in ms and the speed in TFLOP/s, counting FLOPs as FlashAttention
does: forward 4 * batch * heads * seqlen_q * seqlen_k * head_dim, half that for causal with seqlen_q == seqlen_k;
with --window only the (query, key) pairs inside the window are counted; backward 2.5 x forward. Progress of long
runs goes to stderr.

Memory: the host and (CUDA) device memory a run needs is estimated first; a run that would not fit in what is
available (also under ulimit -v) is refused with both figures (exit 2).

Exit codes: 0 success, 1 check failed or the run failed, 2 bad command line, configuration not supported, or
not enough memory.

Example:
  flash4 run --batch 1 --seqlen-q 4096 --heads 16 --head-dim 128 --dtype bf16 --causal --check
)";
}

}  // namespace flash4_cli
