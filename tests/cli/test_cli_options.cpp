// `flash4 run`'s option parser: values out of their type's or their flag's range are refused, never narrowed,
// and forward-only knobs are refused with --backward.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "options.h"

namespace {

flash4_cli::RunOptions parse(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return flash4_cli::parse_run_options(static_cast<int>(argv.size()), argv.data());
}

// The message of the std::invalid_argument that parsing `args` throws ("" when it does not throw).
std::string error_of(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(CliOptions, ItersInRange) {
  EXPECT_EQ(parse({"--iters", "1"}).iters, 1);
  EXPECT_EQ(parse({"--iters=1000000"}).iters, 1000000);
  EXPECT_EQ(error_of({"--iters", "0"}), "--iters must be in [1, 1000000], got 0");
  EXPECT_EQ(error_of({"--iters", "2147483648"}), "--iters must be in [1, 1000000], got 2147483648");
  EXPECT_EQ(error_of({"--iters", "4294967297"}), "--iters must be in [1, 1000000], got 4294967297");
}

TEST(CliOptions, OutOfRangeNumbersNamed) {
  EXPECT_EQ(error_of({"--seqlen", "99999999999999999999"}), "--seqlen: 99999999999999999999 is out of range");
  EXPECT_EQ(error_of({"--window", "4294967296,0"}), "--window: 4294967296 is out of range");
  EXPECT_EQ(error_of({"--seed", "-1"}), "--seed: expected a number, got '-1'");
  EXPECT_EQ(error_of({"--batch", "12x"}), "--batch: expected a number, got '12x'");
}

TEST(CliOptions, Dtypes) {
  EXPECT_EQ(parse({"--dtype", "fp8"}).dtype, flash4::DType::kFloat8E4M3);
  EXPECT_EQ(parse({"--dtype=fp16"}).dtype, flash4::DType::kFloat16);
  EXPECT_EQ(error_of({"--dtype", "e5m2"}), "--dtype: expected bf16, fp16, fp32 or fp8, got 'e5m2'");
  EXPECT_EQ(error_of({"--dtype", "fp8", "--backward"}),
            "--dtype fp8 runs the forward only (there is no FP8 backward); drop --backward");
}

TEST(CliOptions, ForwardKnobsRefusedWithBackward) {
  EXPECT_EQ(error_of({"--backward", "--exp2", "poly"}), "--exp2 applies to the forward only; drop it with --backward");
  EXPECT_EQ(error_of({"--exp2=exact", "--backward"}), "--exp2 applies to the forward only; drop it with --backward");
  EXPECT_EQ(error_of({"--backward", "--no-conditional-rescale"}),
            "--no-conditional-rescale applies to the forward only; drop it with --backward");
  EXPECT_TRUE(parse({"--backward", "--exp2", "auto"}).backward);
  EXPECT_EQ(parse({"--exp2", "poly"}).exp2, flash4::Exp2Mode::kPolynomial);
}

}  // namespace
