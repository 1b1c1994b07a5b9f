// Ownership of a node's shared memory (its object-store arena and segments, all named
// "torus.<node-id-12>.*"), so that the segments of a node that died without cleaning up (SIGKILL,
// OOM kill) can be removed later, and so that nodes on one host can size their arenas together.
//
// A live node holds an exclusive flock on <session>/shm/<prefix>lock for its whole life (the file
// holds its arena's size in bytes). The kernel drops the lock when the process dies, however it
// dies, so "lock free" means "owner gone": no pid reuse or clock races. The descriptor is
// close-on-exec, so workers never hold it.
//
// Thread-compatible; the free functions touch only the filesystem and may run in any process
// (a node at start, `torus stop`, `torus down`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace torus {

class ShmOwnerLock {
 public:
  ShmOwnerLock() = default;
  ~ShmOwnerLock();
  ShmOwnerLock(ShmOwnerLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  ShmOwnerLock& operator=(ShmOwnerLock&& o) noexcept;
  ShmOwnerLock(const ShmOwnerLock&) = delete;
  ShmOwnerLock& operator=(const ShmOwnerLock&) = delete;

  // Creates and locks <session_dir>/shm/<prefix>lock (prefix as "torus.<id12>.") recording
  // `arena_bytes`. Fails when the directory cannot be written or another live process holds it.
  static StatusOr<ShmOwnerLock> Acquire(const std::string& session_dir, const std::string& prefix,
                                        uint64_t arena_bytes);
  // Records a new arena size (after sizing against the siblings).
  void SetArenaBytes(uint64_t arena_bytes);
  // Unlocks and removes the file (the owner cleaned up its segments itself).
  void Release();

 private:
  int fd_ = -1;
  std::string path_;
};

// Removes the segments of every node of `session_dir` whose owner lock is free (the node is
// gone), and their lock files. Returns how many segments were removed.
int CleanDeadNodeSegments(const std::string& session_dir);

// Arena sizes of the live nodes of every session under `session_root` (their locks are held),
// i.e. of the nodes sharing this host's /dev/shm with a new one.
std::vector<uint64_t> LiveArenaBytes(const std::string& session_root);

}  // namespace torus
