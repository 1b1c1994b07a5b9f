// POSIX shared-memory segments holding one large object each (docs/object_store.md).
// A Mapping owns one mmap of a segment and unmaps on destruction; thread-compatible.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/status.h"

namespace torus {

class Mapping {
 public:
  Mapping(void* addr, size_t size) : addr_(addr), size_(size) {}
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* data() const { return static_cast<char*>(addr_); }
  size_t size() const { return size_; }

 private:
  void* addr_;
  size_t size_;
};

// Creates segment `name` (no leading slash) of `size` bytes, mapped read-write. Fails if it exists.
StatusOr<std::unique_ptr<Mapping>> CreateSegment(const std::string& name, size_t size);
// Maps an existing segment read-only.
StatusOr<std::unique_ptr<Mapping>> OpenSegment(const std::string& name);
// Removes the name; existing mappings stay valid until unmapped.
void UnlinkSegment(const std::string& name);
// Unlinks every segment in /dev/shm whose name starts with `prefix`. Returns how many.
int UnlinkSegmentsWithPrefix(const std::string& prefix);

}  // namespace torus
