#include "common/test_rng.h"

#include <cstdlib>
#include <string>

namespace flash4::test {

uint64_t fresh_seed() {
  if (const char* env = std::getenv("FLASH4_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace flash4::test
