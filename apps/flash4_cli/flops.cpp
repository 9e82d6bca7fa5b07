// FLOP counting of `flash4 run` (see flops.h).
#include "flops.h"

#include <algorithm>

namespace flash4_cli {

double visible_pairs(int64_t seqlen_q, int64_t seqlen_k, int64_t window_left, int64_t window_right, bool causal) {
  if (causal) window_right = window_right < 0 ? 0 : std::min<int64_t>(window_right, 0);
  const int64_t shift = seqlen_k - seqlen_q;  // bottom-right alignment: row i's diagonal is key i + shift
  double pairs = 0.0;
  for (int64_t i = 0; i < seqlen_q; ++i) {
    const int64_t lo = window_left < 0 ? 0 : std::max<int64_t>(0, i + shift - window_left);
    const int64_t hi = window_right < 0 ? seqlen_k - 1 : std::min<int64_t>(seqlen_k - 1, i + shift + window_right);
    if (hi >= lo) pairs += static_cast<double>(hi - lo + 1);
  }
  return pairs;
}

double attention_flops(const flash4::ForwardArgs& a, bool backward) {
  const double per_pair = 4.0 * static_cast<double>(a.q.shape[0]) * static_cast<double>(a.q.shape[2]) *
                          static_cast<double>(a.q.shape[3]);
  const int64_t seqlen_q = a.q.shape[1], seqlen_k = a.k.shape[1];
  double pairs;
  if (a.window_left >= 0 || a.window_right >= 0) {
    pairs = visible_pairs(seqlen_q, seqlen_k, a.window_left, a.window_right, a.causal);
  } else {
    pairs = static_cast<double>(seqlen_q) * static_cast<double>(seqlen_k);
    if (a.causal && seqlen_q == seqlen_k) pairs /= 2;
  }
  const double flops = per_pair * pairs;
  return backward ? 2.5 * flops : flops;
}

}  // namespace flash4_cli
