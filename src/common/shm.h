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
// Maps an existing segment, read-only or read-write.
StatusOr<std::unique_ptr<Mapping>> OpenSegment(const std::string& name, bool writable = false);
// Creates a segment of `size` bytes without touching its pages (sparse) and maps it read-write.
StatusOr<std::unique_ptr<Mapping>> CreateSparseSegment(const std::string& name, size_t size);
// Gives the pages of [offset, offset+size) of a segment back to the OS (they read as zero).
void ReleasePages(const Mapping& m, size_t offset, size_t size);
// Removes the name; existing mappings stay valid until unmapped.
void UnlinkSegment(const std::string& name);
// Unlinks every segment in /dev/shm whose name starts with `prefix`. Returns how many.
int UnlinkSegmentsWithPrefix(const std::string& prefix);

}  // namespace torus
