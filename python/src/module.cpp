// flash4._C: the nanobind extension. A thin layer over the C++ API (include/flash4/api.h): DLPack arrays in,
// flash4::TensorView out, the call made with the GIL released, flash4::Error mapped to Python exceptions.
// Allocation, defaults and autograd live in the Python package (python/flash4).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "flash4/api.h"
#include "tensor_view.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace flash4::python {

using InArray = nb::ndarray<nb::ro>;  // read-only inputs: read-only numpy arrays are accepted too
using OutArray = nb::ndarray<>;

// The mask and scalar options shared by forward and backward, in the Python argument order.
struct Options {
  float softmax_scale = 0.0f;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
};

template <typename Args>
void apply(Args& args, const Options& o) {
  args.softmax_scale = o.softmax_scale;
  args.causal = o.causal;
  args.window_left = o.window_left;
  args.window_right = o.window_right;
  args.softcap = o.softcap;
}

Stream to_stream(uintptr_t stream) { return reinterpret_cast<Stream>(stream); }

// Packed-batch and sink arguments, all optional (flash4/api.h). With cu_seqlens the attention tensors are
// (total, heads, head_dim) and the LSE (heads, total_q).
struct Sequences {
  std::optional<InArray> cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, learnable_sink;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;

  bool packed() const { return cu_seqlens_q.has_value() || cu_seqlens_k.has_value(); }
  int attention_rank() const { return packed() ? kPackedAttentionRank : kAttentionRank; }
  int lse_rank() const { return packed() ? kPackedLseRank : kLseRank; }

  template <typename Args>
  void apply(Args& args) const {
    // The library reads a null, empty view as an absent tensor: given offsets without elements would turn the
    // packed call into a dense one.
    for (const auto& [offsets, name] :
         {std::pair{&cu_seqlens_q, "cu_seqlens_q"}, std::pair{&cu_seqlens_k, "cu_seqlens_k"}}) {
      if (offsets->has_value() && (*offsets)->size() == 0) {
        const std::string message =
            std::string(name) + " has no elements; it must hold batch + 1 offsets starting with 0";
        throw nb::value_error(message.c_str());
      }
    }
    const std::pair<const std::optional<InArray>*, std::pair<TensorView*, const char*>> fields[] = {
        {&cu_seqlens_q, {&args.cu_seqlens_q, "cu_seqlens_q"}}, {&cu_seqlens_k, {&args.cu_seqlens_k, "cu_seqlens_k"}},
        {&seqused_q, {&args.seqused_q, "seqused_q"}},          {&seqused_k, {&args.seqused_k, "seqused_k"}},
        {&learnable_sink, {&args.learnable_sink, "learnable_sink"}}};
    for (const auto& [array, field] : fields)
      if (array->has_value()) *field.first = to_view(**array, field.second, kVectorRank);
    args.max_seqlen_q = max_seqlen_q;
    args.max_seqlen_k = max_seqlen_k;
  }
};

// FP8 descale factors (forward only), all optional: fp32 (batch, heads_kv) with float8_e4m3fn q, k, v.
struct Descales {
  std::optional<InArray> q_descale, k_descale, v_descale;

  void apply(ForwardArgs& args) const {
    const std::pair<const std::optional<InArray>*, std::pair<TensorView*, const char*>> fields[] = {
        {&q_descale, {&args.q_descale, "q_descale"}},
        {&k_descale, {&args.k_descale, "k_descale"}},
        {&v_descale, {&args.v_descale, "v_descale"}}};
    for (const auto& [array, field] : fields)
      if (array->has_value()) *field.first = to_descale_view(**array, field.second);
  }
};

ForwardArgs make_forward_args(const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
                              const std::optional<OutArray>& lse, const Options& o, const Sequences& seq,
                              const Descales& descales) {
  ForwardArgs args;
  const int rank = seq.attention_rank();
  args.q = to_view(q, "q", rank);
  args.k = to_view(k, "k", rank);
  args.v = to_view(v, "v", rank);
  args.out = to_view(out, "out", rank);
  if (lse.has_value()) {
    args.lse = to_view(*lse, "lse", seq.lse_rank());
  } else {
    args.lse = TensorView{};  // data null and shape zero: no LSE wanted
    args.lse.rank = seq.lse_rank();
    args.lse.dtype = DType::kFloat32;
  }
  apply(args, o);
  seq.apply(args);
  descales.apply(args);
  return args;
}

BackwardArgs make_backward_args(const InArray& dout, const InArray& q, const InArray& k, const InArray& v,
                                const InArray& out, const InArray& lse, const OutArray& dq, const OutArray& dk,
                                const OutArray& dv, const Options& o, bool deterministic, const Sequences& seq,
                                const std::optional<OutArray>& dsink) {
  BackwardArgs args;
  const int rank = seq.attention_rank();
  args.dout = to_view(dout, "dout", rank);
  args.q = to_view(q, "q", rank);
  args.k = to_view(k, "k", rank);
  args.v = to_view(v, "v", rank);
  args.out = to_view(out, "out", rank);
  args.lse = to_view(lse, "lse", seq.lse_rank());
  args.dq = to_view(dq, "dq", rank);
  args.dk = to_view(dk, "dk", rank);
  args.dv = to_view(dv, "dv", rank);
  if (dsink.has_value()) args.dsink = to_view(*dsink, "dsink", kVectorRank);
  apply(args, o);
  seq.apply(args);
  args.deterministic = deterministic;
  return args;
}

// flash4::Error -> the Python exception its status stands for, carrying the library's message (which names
// the argument). Invalid arguments about an element type are TypeErrors, other invalid arguments ValueErrors.
void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    PyObject* type = PyExc_RuntimeError;
    switch (e.status()) {
      case Status::kInvalidArgument:
        type = std::strstr(e.what(), "dtype") != nullptr ? PyExc_TypeError : PyExc_ValueError;
        break;
      case Status::kNotSupported: type = PyExc_NotImplementedError; break;
      default: type = PyExc_RuntimeError; break;
    }
    PyErr_SetString(type, e.what());
  }
}

void forward(const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
             const std::optional<OutArray>& lse, float softmax_scale, bool causal, int window_left,
             int window_right, float softcap, uintptr_t stream, int exp2_mode, bool conditional_rescale,
             const Sequences& seq, const Descales& descales) {
  ForwardArgs args = make_forward_args(q, k, v, out, lse,
                                       {softmax_scale, causal, window_left, window_right, softcap}, seq, descales);
  if (exp2_mode < 0 || exp2_mode > 2) throw nb::value_error("exp2_mode must be 0 (auto), 1 (exact) or 2 (polynomial)");
  args.tuning.exp2 = static_cast<Exp2Mode>(exp2_mode);
  args.tuning.conditional_rescale = conditional_rescale;
  nb::gil_scoped_release no_gil;
  flash4::forward(args, to_stream(stream));
}

void backward(const InArray& dout, const InArray& q, const InArray& k, const InArray& v, const InArray& out,
              const InArray& lse, const OutArray& dq, const OutArray& dk, const OutArray& dv, float softmax_scale,
              bool causal, int window_left, int window_right, float softcap, bool deterministic,
              uintptr_t stream, const Sequences& seq, const std::optional<OutArray>& dsink) {
  const BackwardArgs args = make_backward_args(dout, q, k, v, out, lse, dq, dk, dv,
                                               {softmax_scale, causal, window_left, window_right, softcap},
                                               deterministic, seq, dsink);
  nb::gil_scoped_release no_gil;
  flash4::backward(args, to_stream(stream));
}

std::pair<bool, std::string> can_implement_forward(const InArray& q, const InArray& k, const InArray& v,
                                                   const OutArray& out, const std::optional<OutArray>& lse,
                                                   float softmax_scale, bool causal, int window_left,
                                                   int window_right, float softcap, const Sequences& seq,
                                                   const Descales& descales) {
  const ForwardArgs args = make_forward_args(q, k, v, out, lse,
                                             {softmax_scale, causal, window_left, window_right, softcap}, seq,
                                             descales);
  const Support s = flash4::can_implement(args);
  return {s.ok, s.reason};
}

std::pair<bool, std::string> can_implement_backward(const InArray& dout, const InArray& q, const InArray& k,
                                                    const InArray& v, const InArray& out, const InArray& lse,
                                                    const OutArray& dq, const OutArray& dk, const OutArray& dv,
                                                    float softmax_scale, bool causal, int window_left,
                                                    int window_right, float softcap, bool deterministic,
                                                    const Sequences& seq, const std::optional<OutArray>& dsink) {
  const BackwardArgs args = make_backward_args(dout, q, k, v, out, lse, dq, dk, dv,
                                               {softmax_scale, causal, window_left, window_right, softcap},
                                               deterministic, seq, dsink);
  const Support s = flash4::can_implement(args);
  return {s.ok, s.reason};
}

// The KV-cache entry points (python/src/kvcache_module.cpp).
void bind_kvcache(nb::module_& m);

}  // namespace flash4::python

NB_MODULE(_C, m) {
  namespace py = flash4::python;
  using py::InArray;
  using py::OutArray;
  using Opt = std::optional<InArray>;
  using OptOut = std::optional<OutArray>;
  m.doc() = "flash4 native extension (use the flash4 package, not this module)";
  nb::register_exception_translator(py::translate_error);

  // The packed-batch and sink keywords every entry point takes (None / 0 = dense, no sink).
  auto sequences = [](Opt cu_q, Opt cu_k, Opt used_q, Opt used_k, int64_t max_q, int64_t max_k, Opt sink) {
    return py::Sequences{std::move(cu_q), std::move(cu_k), std::move(used_q), std::move(used_k), std::move(sink),
                         max_q, max_k};
  };
#define FLASH4_SEQUENCE_KWARGS                                                                                \
  "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(), "seqused_q"_a.none() = nb::none(), \
      "seqused_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0,                          \
      "learnable_sink"_a.none() = nb::none()
  // The FP8 descale keywords of the forward entry points (None = 1).
#define FLASH4_DESCALE_KWARGS \
  "q_descale"_a.none() = nb::none(), "k_descale"_a.none() = nb::none(), "v_descale"_a.none() = nb::none()

  m.def(
      "forward",
      [=](const InArray& q, const InArray& k, const InArray& v, const OutArray& out, const OptOut& lse, float scale,
          bool causal, int left, int right, float softcap, uintptr_t stream, int exp2_mode, bool conditional_rescale,
          Opt cu_q, Opt cu_k, Opt used_q, Opt used_k, int64_t max_q, int64_t max_k, Opt sink, Opt q_descale,
          Opt k_descale, Opt v_descale) {
        py::forward(q, k, v, out, lse, scale, causal, left, right, softcap, stream, exp2_mode, conditional_rescale,
                    sequences(cu_q, cu_k, used_q, used_k, max_q, max_k, sink),
                    py::Descales{std::move(q_descale), std::move(k_descale), std::move(v_descale)});
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "softmax_scale"_a, "causal"_a, "window_left"_a,
      "window_right"_a, "softcap"_a, "stream"_a = 0, "exp2_mode"_a = 0, "conditional_rescale"_a = true,
      FLASH4_SEQUENCE_KWARGS, FLASH4_DESCALE_KWARGS,
      "Attention forward into preallocated out (and lse, or None). softmax_scale 0 = 1/sqrt(head_dim). "
      "stream: a cudaStream_t as int (0 = default stream); ignored on the CPU. cu_seqlens_q/k (int32) make it a "
      "packed batch: q (total_q, heads, head_dim), lse (heads, total_q). float8_e4m3fn q, k, v take "
      "q/k/v_descale (float32 (batch, heads_kv)) and write a bf16 or fp16 out.");
  m.def(
      "backward",
      [=](const InArray& dout, const InArray& q, const InArray& k, const InArray& v, const InArray& out,
          const InArray& lse, const OutArray& dq, const OutArray& dk, const OutArray& dv, float scale, bool causal,
          int left, int right, float softcap, bool deterministic, uintptr_t stream, Opt cu_q, Opt cu_k, Opt used_q,
          Opt used_k, int64_t max_q, int64_t max_k, Opt sink, const OptOut& dsink) {
        py::backward(dout, q, k, v, out, lse, dq, dk, dv, scale, causal, left, right, softcap, deterministic, stream,
                     sequences(cu_q, cu_k, used_q, used_k, max_q, max_k, sink), dsink);
      },
      "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a, "softmax_scale"_a, "causal"_a,
      "window_left"_a, "window_right"_a, "softcap"_a, "deterministic"_a, "stream"_a = 0, FLASH4_SEQUENCE_KWARGS,
      "dsink"_a.none() = nb::none(),
      "Attention backward into preallocated dq, dk, dv (and dsink, the sink's gradient, when given).");
  m.def(
      "can_implement_forward",
      [=](const InArray& q, const InArray& k, const InArray& v, const OutArray& out, const OptOut& lse, float scale,
          bool causal, int left, int right, float softcap, Opt cu_q, Opt cu_k, Opt used_q, Opt used_k, int64_t max_q,
          int64_t max_k, Opt sink, Opt q_descale, Opt k_descale, Opt v_descale) {
        return py::can_implement_forward(q, k, v, out, lse, scale, causal, left, right, softcap,
                                         sequences(cu_q, cu_k, used_q, used_k, max_q, max_k, sink),
                                         py::Descales{std::move(q_descale), std::move(k_descale),
                                                      std::move(v_descale)});
      },
      "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "softmax_scale"_a, "causal"_a, "window_left"_a,
      "window_right"_a, "softcap"_a, FLASH4_SEQUENCE_KWARGS, FLASH4_DESCALE_KWARGS,
      "(ok, reason): whether the tensors' device can run this forward; raises on invalid arguments.");
  m.def(
      "can_implement_backward",
      [=](const InArray& dout, const InArray& q, const InArray& k, const InArray& v, const InArray& out,
          const InArray& lse, const OutArray& dq, const OutArray& dk, const OutArray& dv, float scale, bool causal,
          int left, int right, float softcap, bool deterministic, Opt cu_q, Opt cu_k, Opt used_q, Opt used_k,
          int64_t max_q, int64_t max_k, Opt sink, const OptOut& dsink) {
        return py::can_implement_backward(dout, q, k, v, out, lse, dq, dk, dv, scale, causal, left, right, softcap,
                                          deterministic, sequences(cu_q, cu_k, used_q, used_k, max_q, max_k, sink),
                                          dsink);
      },
      "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a, "softmax_scale"_a, "causal"_a,
      "window_left"_a, "window_right"_a, "softcap"_a, "deterministic"_a, FLASH4_SEQUENCE_KWARGS,
      "dsink"_a.none() = nb::none(), "(ok, reason): whether the tensors' device can run this backward.");
#undef FLASH4_SEQUENCE_KWARGS
#undef FLASH4_DESCALE_KWARGS
  py::bind_kvcache(m);
  m.def("cuda_available", &flash4::cuda_available, "device_index"_a = 0,
        "True when the library was built with CUDA and device `device_index` is a supported (sm_90) GPU.");
  m.def("version", &flash4::version, "Version of the C++ library.");
}
