// The normalized detail::Problem in tests (check/problem_from_args.h), and picking / gathering sampled query rows.
#pragma once

#include <cstdint>
#include <vector>

#include "check/problem_from_args.h"
#include "common/problem.h"
#include "common/test_rng.h"
#include "flash4/api.h"

namespace flash4::test {

using check::make_problem;

// `count` distinct query rows of [0, seqlen_q), always including the first and last, sorted. All rows when
// count >= seqlen_q.
std::vector<int64_t> sample_rows(int64_t seqlen_q, int64_t count, Rng& rng);

// The listed rows of a contiguous (batch, seqlen, heads, head_dim) array, or of a (batch, heads, seqlen) LSE
// array with head_dim = 0, packed into a smaller array (same order for every input, so errors compare).
std::vector<double> gather_rows(const std::vector<double>& full, int64_t batch, int64_t seqlen, int64_t heads,
                                int64_t head_dim, const std::vector<int64_t>& rows);

}  // namespace flash4::test
