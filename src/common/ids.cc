#include "common/ids.h"

#include <random>

namespace torus {

namespace {
std::mt19937_64& Rng() {
  thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }());
  return rng;
}
}  // namespace

std::string Hex64(uint64_t v) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i) {
    s[i] = kDigits[v & 0xf];
    v >>= 4;
  }
  return s;
}

std::string RandomHex(int bytes) {
  std::string out;
  out.reserve(bytes * 2);
  while (static_cast<int>(out.size()) < bytes * 2) out += Hex64(Rng()());
  out.resize(bytes * 2);
  return out;
}

}  // namespace torus
