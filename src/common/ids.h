// Random identifiers (node, worker, actor, task, object ids) as lowercase hex strings.
#pragma once
#include <cstdint>
#include <string>

namespace torus {

// `bytes` random bytes rendered as 2*bytes hex characters. Thread-safe, fast (per-thread PRNG
// seeded from the OS).
std::string RandomHex(int bytes);
// Placement group ids: kPgIdBytes random bytes (NewPgId), minted by the caller that creates the
// group so that a repeated create finds the first one.
inline constexpr int kPgIdBytes = 14;
inline std::string NewPgId() { return RandomHex(kPgIdBytes); }
inline bool IsPgId(const std::string& s) {
  if (s.size() != 2 * kPgIdBytes) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}
// A 64-bit value as 16 hex characters.
std::string Hex64(uint64_t v);

}  // namespace torus
