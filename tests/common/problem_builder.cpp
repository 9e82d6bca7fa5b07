#include "common/problem_builder.h"

#include <set>

namespace flash4::test {

std::vector<int64_t> sample_rows(int64_t seqlen_q, int64_t count, Rng& rng) {
  std::set<int64_t> rows;
  if (count >= seqlen_q) {
    for (int64_t i = 0; i < seqlen_q; ++i) rows.insert(i);
  } else {
    rows.insert(0);
    rows.insert(seqlen_q - 1);
    while (static_cast<int64_t>(rows.size()) < count) rows.insert(rng.uniform_int(0, seqlen_q - 1));
  }
  return {rows.begin(), rows.end()};
}

std::vector<double> gather_rows(const std::vector<double>& full, int64_t batch, int64_t seqlen, int64_t heads,
                                int64_t head_dim, const std::vector<int64_t>& rows) {
  std::vector<double> out;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i : rows) {
        if (head_dim == 0) {
          out.push_back(full[(b * heads + h) * seqlen + i]);
        } else {
          const double* row = full.data() + ((b * seqlen + i) * heads + h) * head_dim;
          out.insert(out.end(), row, row + head_dim);
        }
      }
  return out;
}

}  // namespace flash4::test
