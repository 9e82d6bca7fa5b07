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
namespace {

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

ForwardArgs make_forward_args(const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
                              const std::optional<OutArray>& lse, const Options& o) {
  ForwardArgs args;
  args.q = to_view(q, "q", kAttentionRank);
  args.k = to_view(k, "k", kAttentionRank);
  args.v = to_view(v, "v", kAttentionRank);
  args.out = to_view(out, "out", kAttentionRank);
  if (lse.has_value()) {
    args.lse = to_view(*lse, "lse", kLseRank);
  } else {
    args.lse = TensorView{};  // data null and shape zero: no LSE wanted
    args.lse.rank = kLseRank;
    args.lse.dtype = DType::kFloat32;
  }
  apply(args, o);
  return args;
}

BackwardArgs make_backward_args(const InArray& dout, const InArray& q, const InArray& k, const InArray& v,
                                const InArray& out, const InArray& lse, const OutArray& dq, const OutArray& dk,
                                const OutArray& dv, const Options& o, bool deterministic) {
  BackwardArgs args;
  args.dout = to_view(dout, "dout", kAttentionRank);
  args.q = to_view(q, "q", kAttentionRank);
  args.k = to_view(k, "k", kAttentionRank);
  args.v = to_view(v, "v", kAttentionRank);
  args.out = to_view(out, "out", kAttentionRank);
  args.lse = to_view(lse, "lse", kLseRank);
  args.dq = to_view(dq, "dq", kAttentionRank);
  args.dk = to_view(dk, "dk", kAttentionRank);
  args.dv = to_view(dv, "dv", kAttentionRank);
  apply(args, o);
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
             int window_right, float softcap, uintptr_t stream, int exp2_mode, bool conditional_rescale) {
  ForwardArgs args = make_forward_args(q, k, v, out, lse,
                                       {softmax_scale, causal, window_left, window_right, softcap});
  if (exp2_mode < 0 || exp2_mode > 2) throw nb::value_error("exp2_mode must be 0 (auto), 1 (exact) or 2 (polynomial)");
  args.tuning.exp2 = static_cast<Exp2Mode>(exp2_mode);
  args.tuning.conditional_rescale = conditional_rescale;
  nb::gil_scoped_release no_gil;
  flash4::forward(args, to_stream(stream));
}

void backward(const InArray& dout, const InArray& q, const InArray& k, const InArray& v, const InArray& out,
              const InArray& lse, const OutArray& dq, const OutArray& dk, const OutArray& dv, float softmax_scale,
              bool causal, int window_left, int window_right, float softcap, bool deterministic,
              uintptr_t stream) {
  const BackwardArgs args = make_backward_args(dout, q, k, v, out, lse, dq, dk, dv,
                                               {softmax_scale, causal, window_left, window_right, softcap},
                                               deterministic);
  nb::gil_scoped_release no_gil;
  flash4::backward(args, to_stream(stream));
}

std::pair<bool, std::string> can_implement_forward(const InArray& q, const InArray& k, const InArray& v,
                                                   const OutArray& out, const std::optional<OutArray>& lse,
                                                   float softmax_scale, bool causal, int window_left,
                                                   int window_right, float softcap) {
  const ForwardArgs args = make_forward_args(q, k, v, out, lse,
                                             {softmax_scale, causal, window_left, window_right, softcap});
  const Support s = flash4::can_implement(args);
  return {s.ok, s.reason};
}

std::pair<bool, std::string> can_implement_backward(const InArray& dout, const InArray& q, const InArray& k,
                                                    const InArray& v, const InArray& out, const InArray& lse,
                                                    const OutArray& dq, const OutArray& dk, const OutArray& dv,
                                                    float softmax_scale, bool causal, int window_left,
                                                    int window_right, float softcap, bool deterministic) {
  const BackwardArgs args = make_backward_args(dout, q, k, v, out, lse, dq, dk, dv,
                                               {softmax_scale, causal, window_left, window_right, softcap},
                                               deterministic);
  const Support s = flash4::can_implement(args);
  return {s.ok, s.reason};
}

}  // namespace
}  // namespace flash4::python

NB_MODULE(_C, m) {
  namespace py = flash4::python;
  m.doc() = "flash4 native extension (use the flash4 package, not this module)";
  nb::register_exception_translator(py::translate_error);

  m.def("forward", &py::forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "softmax_scale"_a, "causal"_a,
        "window_left"_a, "window_right"_a, "softcap"_a, "stream"_a = 0, "exp2_mode"_a = 0,
        "conditional_rescale"_a = true,
        "Attention forward into preallocated out (and lse, or None). softmax_scale 0 = 1/sqrt(head_dim). "
        "stream: a cudaStream_t as int (0 = default stream); ignored on the CPU.");
  m.def("backward", &py::backward, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a,
        "softmax_scale"_a, "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a, "deterministic"_a,
        "stream"_a = 0, "Attention backward into preallocated dq, dk, dv.");
  m.def("can_implement_forward", &py::can_implement_forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(),
        "softmax_scale"_a, "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a,
        "(ok, reason): whether the tensors' device can run this forward; raises on invalid arguments.");
  m.def("can_implement_backward", &py::can_implement_backward, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a,
        "dq"_a, "dk"_a, "dv"_a, "softmax_scale"_a, "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a,
        "deterministic"_a, "(ok, reason): whether the tensors' device can run this backward.");
  m.def("cuda_available", &flash4::cuda_available, "device_index"_a = 0,
        "True when the library was built with CUDA and device `device_index` is a supported (sm_90) GPU.");
  m.def("version", &flash4::version, "Version of the C++ library.");
}
