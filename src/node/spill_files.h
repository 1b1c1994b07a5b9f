// SpillFiles: the directory where a node's object store puts values it moves out of shared memory
// (docs/object_store.md, "Spilling"): one file per spilled value, named by a sequence number the
// store chooses, removed when the value is restored or freed and all at once when the node starts
// and stops. A failed write (disk full) leaves no file and says which directory and why.
//
// THREADS: the directory is fixed by Open (before any other call); every other method is a
// self-contained file operation, safe from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace torus {

class SpillFiles {
 public:
  // Creates `dir` (and its parents) and removes the files an earlier node left there.
  Status Open(const std::string& dir);
  const std::string& dir() const { return dir_; }

  // Writes `size` bytes to the file for `seq`; returns its path.
  StatusOr<std::string> Write(uint64_t seq, const char* data, uint64_t size) const;
  // Reads exactly `size` bytes of `path` into `dst`.
  Status Read(const std::string& path, char* dst, uint64_t size) const;
  // Opens `path` for reading (close-on-exec); the descriptor stays valid after Remove.
  StatusOr<int> OpenForRead(const std::string& path) const;
  void Remove(const std::string& path) const;
  // Removes every spill file (the node is stopping).
  void RemoveAll() const;

 private:
  std::string dir_;
};

}  // namespace torus
