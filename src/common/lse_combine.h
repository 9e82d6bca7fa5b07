// Merging partial attention results over disjoint parts of one row's keys by their log-sum-exp: the combine
// step of split-KV decoding (the CPU's, the decode kernel's last-CTA merge and the GPU combine kernel) and the
// formula of the context-parallel merge (python/flash4/_lse_merge.py). For parts s with normalized partial output
// o_s and natural-log lse_s:
//
//   lse = log(sum_s exp(lse_s))  = m + log(sum_s exp(lse_s - m)),  m = max_s lse_s
//   out = sum_s exp(lse_s - lse) * o_s
//
// A part that saw no key has lse_s = -inf and weight 0; if every part is empty, lse = -inf and out = 0. A
// learnable sink is one more part with lse = sink and o = 0: it only enlarges the denominator.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.h"

namespace flash4::detail {

// -inf in host and device code alike (std::numeric_limits is host-only without --expt-relaxed-constexpr).
FLASH4_HD float negative_infinity() { return -INFINITY; }

// The last step of the merge, for callers that reduce over the parts themselves (the GPU combine does it across
// a warp): m = the largest of the parts' lse and the sink, sum = sum_s exp(lse_s - m) over the parts alone.
FLASH4_HD float combined_lse_from_sum(float m, float sum, bool has_sink, float sink) {
  if (m == negative_infinity()) return m;  // no key in any part and no sink
  if (has_sink) sum += expf(sink - m);
  return m + logf(sum);
}

// The merged lse of parts lse[0 .. n) (stride apart) and, when has_sink, the extra logit `sink`. A NaN part
// (NaN in its inputs) makes the merge NaN, as an unsplit row would be, instead of being dropped by the max.
FLASH4_HD float combined_lse(const float* lse, int64_t n, int64_t stride, bool has_sink, float sink) {
  for (int64_t s = 0; s < n; ++s)
    if (lse[s * stride] != lse[s * stride]) return lse[s * stride];
  float m = has_sink ? sink : negative_infinity();
  for (int64_t s = 0; s < n; ++s) m = lse[s * stride] > m ? lse[s * stride] : m;
  float sum = 0.0f;
  if (m != negative_infinity())
    for (int64_t s = 0; s < n; ++s) sum += expf(lse[s * stride] - m);
  return combined_lse_from_sum(m, sum, has_sink, sink);
}

// The weight exp(lse_s - lse) of a part in the merged output (0 for an empty part or an empty merge).
FLASH4_HD float combine_weight(float lse_part, float lse) {
  if (lse_part == negative_infinity() || lse == negative_infinity()) return 0.0f;
  return expf(lse_part - lse);
}

}  // namespace flash4::detail
