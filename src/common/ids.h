// Random identifiers (node, worker, actor, task, object ids) as lowercase hex strings.
#pragma once
#include <cstdint>
#include <string>

namespace torus {

// `bytes` random bytes rendered as 2*bytes hex characters. Thread-safe, fast (per-thread PRNG
// seeded from the OS).
std::string RandomHex(int bytes);
// A 64-bit value as 16 hex characters.
std::string Hex64(uint64_t v);

}  // namespace torus
