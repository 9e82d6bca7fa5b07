// Validation of the FP8 forward (see validate_fp8.h and flash4/api.h).
#include "api/validate_fp8.h"

#include <string>
#include <tuple>

namespace flash4::detail {
namespace {

constexpr const char* kDescaleDims[2] = {"batch", "heads_kv"};

}  // namespace

void check_fp8_forward(const Checker& c, const ForwardArgs& args, Problem& p) {
  const bool fp8 = args.q.dtype == DType::kFloat8E4M3;
  if (fp8) {
    FLASH4_REQUIRE(c, args.out.dtype == DType::kBFloat16 || args.out.dtype == DType::kFloat16,
                   std::string("out.dtype is ") + dtype_name(args.out.dtype) +
                       " but an FP8 (float8_e4m3fn) forward writes bf16 or fp16: pass out in the dtype you want");
  } else {
    FLASH4_REQUIRE(c, args.out.dtype == args.q.dtype,
                   std::string("out.dtype is ") + dtype_name(args.out.dtype) + " but q.dtype is " +
                       dtype_name(args.q.dtype) + "; they must match");
  }
  for (const auto& [t, name, slot] : {std::tuple{&args.q_descale, "q_descale", &p.q_descale},
                                      std::tuple{&args.k_descale, "k_descale", &p.k_descale},
                                      std::tuple{&args.v_descale, "v_descale", &p.v_descale}}) {
    if (!present(*t)) continue;
    FLASH4_REQUIRE(c, fp8,
                   std::string(name) + " is set but q.dtype is " + dtype_name(args.q.dtype) +
                       "; descale factors belong to float8_e4m3fn q, k, v");
    check_tensor(c, *t, name, 2, kDescaleDims);
    FLASH4_REQUIRE(c, t->dtype == DType::kFloat32,
                   std::string(name) + ".dtype is " + dtype_name(t->dtype) + " but must be fp32");
    const int64_t expected[2] = {p.batch, p.heads_kv};
    for (int i = 0; i < 2; ++i) {
      FLASH4_REQUIRE(c, t->shape[i] == expected[i],
                     dim_label(name, i, kDescaleDims) + " = " + std::to_string(t->shape[i]) + " but expected " +
                         std::to_string(expected[i]) + "; " + name + " must be (batch, heads_kv)" +
                         (p.varlen() ? " with batch the number of segments" : ""));
    }
    check_same_device(c, *t, name, args.q, "q");
    *slot = Descale{static_cast<const float*>(t->data), t->stride[0], t->stride[1]};
  }
}

}  // namespace flash4::detail
