// libFuzzer target for the API's argument validation (fuzz/README.md). Each input describes a ForwardArgs or
// BackwardArgs, dense or packed: shapes, strides, dtypes and devices (invalid enum values too), data pointers into
// one arena (aliasing often), null or wild, scalars including NaN, infinities and huge values, and host index
// tensors (cu_seqlens, seqused) whose contents are valid offsets or corrupt ones, plus the learnable sink.
// Properties:
//   - can_implement and forward/backward either accept or throw flash4::Error(kInvalidArgument) whose message
//     starts with the entry point's name; any other exception, a crash or a sanitizer report is a finding;
//   - a call that throws leaves the arena untouched (nothing written to the outputs);
//   - a call that runs (CPU tensors inside the arena) writes nothing outside its outputs' byte ranges.
#include "fuzz_args.h"

namespace {

using namespace flash4::fuzz;

// Multiply-adds of a run, from the views themselves (a zero stride lets a huge shape fit in the arena): dense
// (batch, seqlen, heads, d) or packed (total, heads, d), bounded by every query against every key.
double work(const flash4::TensorView& q, const flash4::TensorView& k) {
  double w = 1.0;
  if (q.rank == 3) {
    for (const int64_t x : {q.shape[0], q.shape[1], q.shape[2], k.shape[0]}) w *= static_cast<double>(x);
  } else {
    for (const int64_t x : {q.shape[0], q.shape[1], q.shape[2], q.shape[3], k.shape[1]}) w *= static_cast<double>(x);
  }
  return w < 0 ? std::numeric_limits<double>::infinity() : w;
}

// The packed-batch and sink arguments both passes share; their views join `inputs`.
template <class Args>
void pick_sequences(FuzzedDataProvider& in, Args& a, bool packed, int64_t batch, int64_t heads,
                    std::vector<const flash4::TensorView*>& inputs) {
  if (packed) {
    a.cu_seqlens_q = pick_vector(in, batch + 1, flash4::DType::kInt32);
    a.cu_seqlens_k = pick_vector(in, batch + 1, flash4::DType::kInt32);
    a.max_seqlen_q = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? pick_size(in) : 0;
    a.max_seqlen_k = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? pick_size(in) : 0;
    const int64_t longest_q = fill_index(in, a.cu_seqlens_q, true, 5);
    const int64_t longest_k = fill_index(in, a.cu_seqlens_k, true, 5);
    if (a.max_seqlen_q == 0) a.max_seqlen_q = longest_q;
    if (a.max_seqlen_k == 0) a.max_seqlen_k = longest_k;
    inputs.push_back(&a.cu_seqlens_q);
    inputs.push_back(&a.cu_seqlens_k);
  }
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    a.seqused_q = pick_vector(in, batch, flash4::DType::kInt32);
    fill_index(in, a.seqused_q, false, 6);
    inputs.push_back(&a.seqused_q);
  }
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    a.seqused_k = pick_vector(in, batch, flash4::DType::kInt32);
    fill_index(in, a.seqused_k, false, 6);
    inputs.push_back(&a.seqused_k);
  }
  if (in.ConsumeIntegralInRange<int>(0, 2) == 0) {
    a.learnable_sink = pick_vector(in, heads, flash4::DType::kFloat32);
    inputs.push_back(&a.learnable_sink);
  }
}

// With FLASH4_FUZZ_STATS set, how many calls of each kind ran to completion, printed at exit: shows that the
// generator reaches the computing paths, not only the refusals.
struct RunStats {
  long dense = 0, packed = 0, sink = 0;
  ~RunStats() {
    if (std::getenv("FLASH4_FUZZ_STATS") != nullptr)
      std::fprintf(stderr, "calls run: dense %ld, packed %ld, with a sink %ld\n", dense, packed, sink);
  }
} g_stats;

void count_run(bool packed, bool sink) {
  ++(packed ? g_stats.packed : g_stats.dense);
  if (sink) ++g_stats.sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  reset_arena();

  // (batch, seqlen_q, heads, head_dim): small sizes, head_dim a multiple of 8 (up to 40).
  const std::array<int64_t, 4> q_shape = {
      in.ConsumeIntegralInRange<int64_t>(0, 2), in.ConsumeIntegralInRange<int64_t>(0, 9),
      in.ConsumeIntegralInRange<int64_t>(0, 4), 8 * in.ConsumeIntegralInRange<int64_t>(0, 5)};
  std::array<int64_t, 4> kv_shape = q_shape;
  kv_shape[1] = in.ConsumeIntegralInRange<int64_t>(0, 9);
  kv_shape[2] = in.ConsumeBool() ? q_shape[2] : in.ConsumeIntegralInRange<int64_t>(0, 4);
  const auto scope = in.ConsumeBool() ? flash4::Validation::kFull : flash4::Validation::kWithoutBuffers;
  // Packed batches: q (total_q, heads, d), k/v (total_k, heads_kv, d), lse (heads, total_q), where total is the
  // dense shape's batch * seqlen.
  const bool packed = in.ConsumeIntegralInRange<int>(0, 2) == 0;
  const int rank = packed ? 3 : 4;
  const std::array<int64_t, 4> q_view = packed ? std::array<int64_t, 4>{q_shape[0] * q_shape[1], q_shape[2], q_shape[3], 0}
                                               : q_shape;
  const std::array<int64_t, 4> kv_view =
      packed ? std::array<int64_t, 4>{kv_shape[0] * kv_shape[1], kv_shape[2], kv_shape[3], 0} : kv_shape;
  const std::array<int64_t, 4> lse_shape = packed ? std::array<int64_t, 4>{q_shape[2], q_view[0], 0, 0}
                                                  : std::array<int64_t, 4>{q_shape[0], q_shape[2], q_shape[1], 0};
  const int lse_rank = packed ? 2 : 3;

  if (in.ConsumeBool()) {
    flash4::ForwardArgs a;
    a.q = pick_view(in, rank, q_view);
    a.k = pick_view(in, rank, kv_view);
    a.v = pick_view(in, rank, kv_view);
    a.out = pick_view(in, rank, q_view);
    if (in.ConsumeBool()) a.lse = pick_view(in, lse_rank, lse_shape);
    a.softmax_scale = pick_scalar(in);
    a.softcap = pick_scalar(in);
    a.causal = in.ConsumeBool();
    a.window_left = pick_window(in);
    a.window_right = pick_window(in);
    a.tuning.exp2 = static_cast<flash4::Exp2Mode>(in.ConsumeIntegralInRange<int>(0, 2));
    a.tuning.conditional_rescale = in.ConsumeBool();
    std::vector<const flash4::TensorView*> all = {&a.q, &a.k, &a.v, &a.out}, outputs = {&a.out};
    pick_sequences(in, a, packed, q_shape[0], q_shape[2], all);
    try {
      (void)flash4::can_implement(a, scope);
    } catch (const flash4::Error& e) {
      check_error(e, "flash4::forward: ");
    }
    const bool has_lse = a.lse.data != nullptr;
    if (has_lse) {
      all.push_back(&a.lse);
      outputs.push_back(&a.lse);
    }
    run_checked(all, outputs, work(a.q, a.k), "flash4::forward: ", [&] {
      flash4::forward(a);
      count_run(packed, a.learnable_sink.data != nullptr);
    });
  } else {
    flash4::BackwardArgs a;
    a.dout = pick_view(in, rank, q_view);
    a.q = pick_view(in, rank, q_view);
    a.k = pick_view(in, rank, kv_view);
    a.v = pick_view(in, rank, kv_view);
    a.out = pick_view(in, rank, q_view);
    a.lse = pick_view(in, lse_rank, lse_shape);
    a.dq = pick_view(in, rank, q_view);
    a.dk = pick_view(in, rank, kv_view);
    a.dv = pick_view(in, rank, kv_view);
    a.softmax_scale = pick_scalar(in);
    a.softcap = pick_scalar(in);
    a.causal = in.ConsumeBool();
    a.window_left = pick_window(in);
    a.window_right = pick_window(in);
    a.deterministic = in.ConsumeBool();
    std::vector<const flash4::TensorView*> all = {&a.dout, &a.q, &a.k, &a.v, &a.out, &a.lse, &a.dq, &a.dk, &a.dv};
    std::vector<const flash4::TensorView*> outputs = {&a.dq, &a.dk, &a.dv};
    pick_sequences(in, a, packed, q_shape[0], q_shape[2], all);
    if (a.learnable_sink.data != nullptr) {
      a.dsink = pick_vector(in, q_shape[2], flash4::DType::kFloat32);
      all.push_back(&a.dsink);
      outputs.push_back(&a.dsink);
    }
    try {
      (void)flash4::can_implement(a, scope);
    } catch (const flash4::Error& e) {
      check_error(e, "flash4::backward: ");
    }
    run_checked(all, outputs, 2.5 * work(a.q, a.k), "flash4::backward: ", [&] {
      flash4::backward(a);
      count_run(packed, a.learnable_sink.data != nullptr);
    });
  }
  return 0;
}
