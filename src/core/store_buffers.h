// The two kinds of bytes a Get hands back (internal::Buffer): an inline value owned by a shared
// string, and a value read in place in the node's object-store arena, which holds one pin of the
// value's header (common/object_header.h) so the node does not spill it while in use.
//
// THREADS: immutable once built; any thread may read or drop one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/object_header.h"
#include "common/shm.h"
#include "torus/internal/runtime.h"

namespace torus::core {

// Bytes owned by a shared string (small values).
class InlineBuffer final : public internal::Buffer {
 public:
  explicit InlineBuffer(std::shared_ptr<const std::string> s) : s_(std::move(s)) {}
  const char* data() const override { return s_->data(); }
  size_t size() const override { return s_->size(); }

 private:
  std::shared_ptr<const std::string> s_;
};

// A value inside the node's object-store arena, read in place. It takes over one pin of the
// value's header (common/object_header.h), taken by its creator, so the node does not spill the
// value while the buffer lives, and gives it back when it goes; it keeps the arena mapped.
class ArenaBuffer final : public internal::Buffer {
 public:
  ArenaBuffer(std::shared_ptr<Mapping> arena, uint64_t offset, uint64_t size)
      : arena_(std::move(arena)), offset_(offset), size_(size) {}
  ~ArenaBuffer() override { object_header::Unpin(arena_->data() + offset_ - object_header::kBytes); }
  const char* data() const override { return arena_->data() + offset_; }
  size_t size() const override { return size_; }

 private:
  std::shared_ptr<Mapping> arena_;
  uint64_t offset_, size_;
};

}  // namespace torus::core
