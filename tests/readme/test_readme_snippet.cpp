// README.md's C++ API snippet, compiled from the README itself (tests/CMakeLists.txt) and run on the CPU: with
// valid sizes it computes attention; with the README's kind of mistake it reports the error and returns (it must
// not terminate with an uncaught flash4::Error).
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "flash4/api.h"

void run_readme_snippet(void* q, void* k, void* v, void* out, void* lse, int64_t batch, int64_t seqlen_q,
                        int64_t seqlen_k, int64_t heads, int64_t heads_kv, int64_t head_dim, flash4::Stream stream);

namespace {

struct SnippetRun {
  std::vector<uint16_t> q, k, v, out;  // bf16 bits
  std::vector<float> lse;
  std::string errors;  // what the snippet wrote to std::cerr
};

SnippetRun run(int64_t heads, int64_t heads_kv) {
  const int64_t batch = 1, seqlen_q = 20, seqlen_k = 24, head_dim = 64;
  SnippetRun r;
  r.q.assign(batch * seqlen_q * heads * head_dim, 0x3f80);  // 1.0 in bf16
  r.k.assign(batch * seqlen_k * heads_kv * head_dim, 0x3f00);  // 0.5
  r.v.assign(r.k.size(), 0x4000);                              // 2.0
  r.out.assign(r.q.size(), 0);
  r.lse.assign(batch * heads * seqlen_q, 0.0f);
  std::ostringstream captured;
  std::streambuf* const saved = std::cerr.rdbuf(captured.rdbuf());
  run_readme_snippet(r.q.data(), r.k.data(), r.v.data(), r.out.data(), r.lse.data(), batch, seqlen_q, seqlen_k,
                     heads, heads_kv, head_dim, nullptr);
  std::cerr.rdbuf(saved);
  r.errors = captured.str();
  return r;
}

TEST(ReadmeSnippet, RunsValidArguments) {
  const SnippetRun r = run(4, 2);
  EXPECT_EQ(r.errors, "");
  for (uint16_t x : r.out) ASSERT_EQ(x, 0x4000) << "every key's value is 2, so out is 2";
}

TEST(ReadmeSnippet, ReportsInvalidArgumentsInsteadOfTerminating) {
  const SnippetRun r = run(6, 4);  // heads not a multiple of heads_kv: can_implement throws
  EXPECT_NE(r.errors.find("not a multiple of k.shape[2] (heads_kv) = 4"), std::string::npos) << r.errors;
  for (uint16_t x : r.out) ASSERT_EQ(x, 0) << "nothing written on an error";
}

}  // namespace
