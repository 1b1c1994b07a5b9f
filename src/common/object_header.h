// ObjectHeader: the 64 bytes in front of every value in a node's object-store arena
// (docs/object_store.md, "Spilling"). Its first 8 bytes are one atomic word shared by every
// process of the node:
//   bits 63..28  tag   (36 bits of a hash of the object's key: which value this header belongs to)
//   bits 27..24  state (kResident: readable; kSpilling: the node is moving it to disk)
//   bits 23..0   pins  (readers using the bytes now, and the writer until it has written them)
// A reader pins before touching the bytes and unpins when its buffer goes; the node spills only a
// value it can claim with no pin (resident -> spilling in one compare-and-swap), so no new pin can
// be taken while it copies the bytes out. A reader whose location is stale (the value was spilled
// and the range reused) finds another tag, or no header at all, and asks the node to restore it.
//
// THREADS: lock-free; any process and thread of the node. Pure functions over a mapped word.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

namespace torus::object_header {

inline constexpr uint64_t kBytes = 64;  // in front of the value; keeps values 64-byte aligned
inline constexpr uint64_t kPinBits = 24;
inline constexpr uint64_t kPinMask = (uint64_t{1} << kPinBits) - 1;
inline constexpr uint64_t kStateShift = 24;
inline constexpr uint64_t kTagShift = 28;
inline constexpr uint64_t kResident = 1;
inline constexpr uint64_t kSpilling = 2;

// The header's tag for a key: FNV-1a, 36 bits, never 0.
inline uint64_t TagOf(std::string_view key) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  h >>= kTagShift;
  return h ? h : 1;
}

inline uint64_t Word(uint64_t tag, uint64_t state, uint64_t pins) {
  return (tag << kTagShift) | (state << kStateShift) | pins;
}
inline uint64_t TagPart(uint64_t w) { return w >> kTagShift; }
inline uint64_t StatePart(uint64_t w) { return (w >> kStateShift) & 0xf; }
inline uint64_t PinPart(uint64_t w) { return w & kPinMask; }

inline std::atomic_ref<uint64_t> At(char* header) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(header));
}

// The node, before handing the range out: resident with `pins` pins (1: the writer's).
inline void Init(char* header, uint64_t tag, uint64_t pins) {
  At(header).store(Word(tag, kResident, pins), std::memory_order_release);
}

// A reader: one more pin when the header holds `tag` and is resident; false otherwise (spilled
// or being spilled, freed, or the range now holds another value).
inline bool TryPin(char* header, uint64_t tag) {
  auto a = At(header);
  uint64_t w = a.load(std::memory_order_acquire);
  for (;;) {
    if (TagPart(w) != tag || StatePart(w) != kResident || PinPart(w) == kPinMask) return false;
    if (a.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel)) return true;
  }
}

// Gives one pin back (the caller holds one).
inline void Unpin(char* header) { At(header).fetch_sub(1, std::memory_order_acq_rel); }

// The node: claims an unpinned resident value for spilling; false when it is pinned.
inline bool TryClaim(char* header, uint64_t tag) {
  uint64_t expected = Word(tag, kResident, 0);
  return At(header).compare_exchange_strong(expected, Word(tag, kSpilling, 0),
                                            std::memory_order_acq_rel);
}

// The node: undoes a claim (spilling failed); the value stays resident.
inline void Unclaim(char* header, uint64_t tag) {
  At(header).store(Word(tag, kResident, 0), std::memory_order_release);
}

inline uint64_t Pins(char* header) { return PinPart(At(header).load(std::memory_order_acquire)); }

}  // namespace torus::object_header
