// Deterministic test values shared by the multi-process tests: byte patterns and their checksum.
#pragma once

#include <cstdint>
#include <vector>

namespace torus_test {

// n pseudo-random bytes (xorshift32), a different sequence per seed.
inline std::vector<uint8_t> Pattern(int64_t n, int seed) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  uint32_t x = 2463534242u + static_cast<uint32_t>(seed);
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

// FNV-1a of the bytes, mixed with the length.
inline uint64_t Fnv(const std::vector<uint8_t>& v) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : v) h = (h ^ b) * 1099511628211ull;
  return h ^ v.size();
}

}  // namespace torus_test
