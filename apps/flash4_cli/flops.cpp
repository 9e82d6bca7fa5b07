// FLOP counting of `flash4 run` (see flops.h).
#include "flops.h"

#include <algorithm>

namespace flash4_cli {

double visible_pairs(int64_t seqlen_q, int64_t seqlen_k, int64_t window_left, int64_t window_right, bool causal) {
  if (causal) window_right = window_right < 0 ? 0 : std::min<int64_t>(window_right, 0);
  double pairs = 0.0;
  for (int64_t i = 0; i < seqlen_q; ++i) {
    const int64_t diag = seqlen_k - (seqlen_q - i);  // bottom-right alignment: row i's diagonal key
    // Each window side is compared with the distance to its edge before it is added: with an empty batch the
    // lengths are not bounded by any tensor, and diag + window_right could pass int64's limit.
    const int64_t lo = window_left < 0 || window_left >= diag ? 0 : diag - window_left;
    const int64_t hi = window_right < 0 || window_right >= seqlen_k - 1 - diag ? seqlen_k - 1 : diag + window_right;
    if (hi >= lo) pairs += static_cast<double>(hi - lo + 1);
  }
  return pairs;
}

double attention_flops(const flash4::ForwardArgs& a, bool backward) {
  const double per_pair = 4.0 * static_cast<double>(a.q.shape[0]) * static_cast<double>(a.q.shape[2]) *
                          static_cast<double>(a.q.shape[3]);
  const int64_t seqlen_q = a.q.shape[1], seqlen_k = a.k.shape[1];
  if (per_pair == 0.0) return 0.0;  // an empty batch's lengths may be huge: its rows are not walked
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
