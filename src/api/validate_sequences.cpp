// Validation of variable-length batches and the learnable sink (see validate_sequences.h and flash4/api.h).
#include "api/validate_sequences.h"

#include <cstdint>
#include <limits>
#include <string>
#include <tuple>

namespace flash4::detail {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
constexpr const char* kIndexDims[1] = {"batch + 1"};
constexpr const char* kBatchDims[1] = {"batch"};
constexpr const char* kHeadDims[1] = {"heads"};

// A rank-1 tensor of `dtype` and `length` elements, contiguous, on q's device.
void check_vector(const Checker& c, const TensorView& t, const char* name, DType dtype, int64_t length,
                  const char* const* dims, const TensorView& q) {
  check_tensor(c, t, name, 1, dims);
  FLASH4_REQUIRE(c, t.dtype == dtype,
                 std::string(name) + ".dtype is " + dtype_name(t.dtype) + " but must be " + dtype_name(dtype));
  FLASH4_REQUIRE(c, t.shape[0] == length,
                 dim_label(name, 0, dims) + " = " + std::to_string(t.shape[0]) + " but expected " +
                     std::to_string(length));
  check_same_device(c, t, name, q, "q");
}

// Host-resident seqused: each entry in [0, its segment's length].
void check_host_seqused(const Checker& c, const TensorView& t, const char* name, const Problem& p, bool keys) {
  const int* used = static_cast<const int*>(t.data);
  const SequenceLayout whole = [&] {
    SequenceLayout l = p.layout();
    l.seqused_q = l.seqused_k = nullptr;
    return l;
  }();
  for (int64_t b = 0; b < p.batch; ++b) {
    const SequenceInfo s = whole.info(b);
    const int64_t segment = keys ? s.seqlen_k : s.seqlen_q;
    FLASH4_REQUIRE(c, used[b] >= 0 && used[b] <= segment,
                   std::string(name) + "[" + std::to_string(b) + "] = " + std::to_string(used[b]) +
                       " but must be in [0, " + std::to_string(segment) + "] (the length of segment " +
                       std::to_string(b) + ")");
  }
}

}  // namespace

void check_host_offsets(const Checker& c, const int* cu, const char* name, int64_t batch, int64_t total,
                        int64_t max_seqlen, const char* total_name, const char* max_name) {
  FLASH4_REQUIRE(c, cu[0] == 0, std::string(name) + "[0] = " + std::to_string(cu[0]) + " but must be 0");
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = int64_t{cu[b + 1]} - cu[b];
    FLASH4_REQUIRE(c, length >= 0,
                   std::string(name) + " must be non-decreasing, but " + name + "[" + std::to_string(b + 1) +
                       "] = " + std::to_string(cu[b + 1]) + " < " + name + "[" + std::to_string(b) +
                       "] = " + std::to_string(cu[b]));
    FLASH4_REQUIRE(c, length <= max_seqlen,
                   "segment " + std::to_string(b) + " of " + name + " has " + std::to_string(length) +
                       " tokens but " + max_name + " = " + std::to_string(max_seqlen) +
                       "; max_seqlen must bound every segment");
  }
  FLASH4_REQUIRE(c, cu[batch] <= total,
                 std::string(name) + "[" + std::to_string(batch) + "] = " + std::to_string(cu[batch]) +
                     " exceeds " + total_name + " = " + std::to_string(total) + " (the packed tensor's rows)");
}

bool packed_layout_requested(const Checker& c, const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k) {
  const bool q = present(cu_seqlens_q), k = present(cu_seqlens_k);
  FLASH4_REQUIRE(c, q == k,
                 std::string(q ? "cu_seqlens_q" : "cu_seqlens_k") + " is set but " +
                     (q ? "cu_seqlens_k" : "cu_seqlens_q") + " is not; a packed batch needs both");
  return q;
}

void check_sequence_args(const Checker& c, const SequenceArgs& a, Problem& p) {
  const bool packed = present(a.cu_seqlens_q);
  const bool host = a.q.device.kind == DeviceKind::kCpu;
  if (packed) {
    check_tensor(c, a.cu_seqlens_q, "cu_seqlens_q", 1, kIndexDims);
    FLASH4_REQUIRE(c, a.cu_seqlens_q.shape[0] >= 1,
                   "cu_seqlens_q.shape[0] (batch + 1) = 0 but must be >= 1 (cu_seqlens_q[0] = 0 is always present)");
    p.batch = a.cu_seqlens_q.shape[0] - 1;
    check_vector(c, a.cu_seqlens_q, "cu_seqlens_q", DType::kInt32, p.batch + 1, kIndexDims, a.q);
    check_vector(c, a.cu_seqlens_k, "cu_seqlens_k", DType::kInt32, p.batch + 1, kIndexDims, a.q);
    // int32 offsets address at most 2^31 - 1 rows.
    FLASH4_REQUIRE(c, p.total_q <= kMaxInt32,
                   "q.shape[0] (total) = " + std::to_string(p.total_q) + " exceeds the int32 offsets' range");
    FLASH4_REQUIRE(c, p.total_k <= kMaxInt32,
                   "k.shape[0] (total) = " + std::to_string(p.total_k) + " exceeds the int32 offsets' range");
    for (const auto& [max, total, name] : {std::tuple{a.max_seqlen_q, p.total_q, "max_seqlen_q"},
                                           std::tuple{a.max_seqlen_k, p.total_k, "max_seqlen_k"}}) {
      FLASH4_REQUIRE(c, max >= 0 && max <= kMaxInt32,
                     std::string(name) + " = " + std::to_string(max) + " must be in [0, 2^31 - 1]");
      // 0 would make the kernels clamp every segment to nothing: almost surely a forgotten argument.
      FLASH4_REQUIRE(c, max >= 1 || total == 0,
                     std::string(name) + " = 0 but the packed tensor has " + std::to_string(total) +
                         " rows; set it to the longest segment's length");
    }
    p.seqlen_q = a.max_seqlen_q;
    p.seqlen_k = a.max_seqlen_k;
    p.cu_seqlens_q = static_cast<const int*>(a.cu_seqlens_q.data);
    p.cu_seqlens_k = static_cast<const int*>(a.cu_seqlens_k.data);
    if (host && c.buffers()) {  // without buffers the offsets are not read
      check_host_offsets(c, p.cu_seqlens_q, "cu_seqlens_q", p.batch, p.total_q, p.seqlen_q, "q.shape[0] (total_q)",
                         "max_seqlen_q");
      check_host_offsets(c, p.cu_seqlens_k, "cu_seqlens_k", p.batch, p.total_k, p.seqlen_k, "k.shape[0] (total_k)",
                         "max_seqlen_k");
    }
  } else {
    FLASH4_REQUIRE(c, a.max_seqlen_q == 0 && a.max_seqlen_k == 0,
                   "max_seqlen_q = " + std::to_string(a.max_seqlen_q) + " and max_seqlen_k = " +
                       std::to_string(a.max_seqlen_k) + " but they are only used with cu_seqlens; leave them 0");
  }
  for (const auto& [t, name, keys] : {std::tuple{&a.seqused_q, "seqused_q", false},
                                      std::tuple{&a.seqused_k, "seqused_k", true}}) {
    if (!present(*t)) continue;
    check_vector(c, *t, name, DType::kInt32, p.batch, kBatchDims, a.q);
    if (host && c.buffers()) check_host_seqused(c, *t, name, p, keys);
    (keys ? p.seqused_k : p.seqused_q) = static_cast<const int*>(t->data);
  }
  if (present(a.learnable_sink)) {
    check_vector(c, a.learnable_sink, "learnable_sink", DType::kFloat32, p.heads, kHeadDims, a.q);
    p.learnable_sink = static_cast<const float*>(a.learnable_sink.data);
  }
}

bool check_dsink(const Checker& c, const TensorView& dsink, const TensorView& learnable_sink, const TensorView& q,
                 const Problem& p) {
  if (!present(dsink)) return false;
  FLASH4_REQUIRE(c, present(learnable_sink), "dsink is set but learnable_sink is not; dsink is its gradient");
  check_vector(c, dsink, "dsink", DType::kFloat32, p.heads, kHeadDims, q);
  return true;
}

}  // namespace flash4::detail
