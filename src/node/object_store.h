// ObjectStore: the node's shared-memory object store as a service part (docs/object_store.md):
// the arena segment every process of the node maps, its allocator (node/arena.h) and the
// directory of the objects in it (key -> offset, size, owner). Workers reserve ranges
// (CreateObject) and write the bytes themselves; owners free them (FreeObjects); other nodes
// pull them in chunks (FetchObject). Every value has a header (common/object_header.h) that
// readers pin; when a range does not fit, unpinned values are spilled to disk, oldest first
// (SpillFiles), and brought back by RestoreObject when a reader on this node wants them (the
// file stays until the value is freed, so a restored value is spilled again without a write).
//
// THREADS: gRPC handler threads call every method. spill_mu_ serialises spilling and restoring
// (the file I/O runs under it, not under mu_); mu_ guards the directory and the allocator and
// is never held with the node's NodeState::mu. Fetch streams a pinned range, or a spilled
// file, without either lock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/object_header.h"
#include "common/shm.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "node/arena.h"
#include "node/spill_files.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

class ObjectStore {
 public:
  explicit ObjectStore(const std::string& node_id) : node_id_(node_id) {}
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  // Creates the arena segment `name` of `capacity` bytes and the spill directory (once, from
  // Node::Start).
  Status Open(const std::string& name, uint64_t capacity, const std::string& spill_dir) EXCLUDES(mu_);
  const std::string& name() const { return name_; }
  uint64_t capacity() const { return arena_ ? arena_->size() : 0; }

  // CreateObject: reserves a range for the object, spilling unpinned values when it does not
  // fit; the reply's offset is pinned once for the writer (ALREADY_EXISTS for a key in use; a
  // store full of pinned values, or a full disk, answers with a kResourceExhausted error).
  grpc::Status Create(const rpc::CreateObjectRequest& req, rpc::CreateObjectReply* reply)
      EXCLUDES(mu_, spill_mu_);
  // RestoreObject: the key's value resident again (read back from its spill file when spilled),
  // pinned once for the caller; the reply's offset says where. A kNotFound error when the key
  // is not stored here (freed).
  void Restore(const std::string& key, rpc::CreateObjectReply* reply) EXCLUDES(mu_, spill_mu_);
  // FreeObjects: forgets the objects and gives their ranges back (unknown keys are ignored); a
  // range a reader still pins is given back once its last pin goes (a late unpin must never
  // land in another value's header).
  void Free(const rpc::FreeObjectsRequest& req) EXCLUDES(mu_);
  // The caller of a Create (`created`) or Restore that answered `offset` is gone (its deadline
  // passed, so it never learned the offset): the pin the reply carried is given back, and a
  // created value is freed (nobody else knows of it).
  void Abandon(const std::string& key, uint64_t offset, bool created) EXCLUDES(mu_);
  // FetchObject: streams the object's bytes in chunks (NOT_FOUND for an unknown key).
  grpc::Status Fetch(const rpc::FetchObjectRequest& req, grpc::ServerWriter<rpc::ObjectChunk>* writer)
      EXCLUDES(mu_, spill_mu_);
  // Info's part: the objects, their bytes and the arena's capacity.
  void FillInfo(rpc::NodeInfoReply* reply) const EXCLUDES(mu_);
  struct Stats {
    uint64_t bytes = 0, objects = 0, capacity = 0;  // resident values
    uint64_t spilled_bytes = 0, spilled_objects = 0;
  };
  Stats GetStats() const EXCLUDES(mu_);
  // Forgets every object and removes the spill files (the node is stopping).
  void Clear() EXCLUDES(mu_);

 private:
  struct StoredObject {
    std::string object_id;
    uint64_t size = 0;
    uint64_t offset = 0;  // of the value; its header is the kBytes before (when resident)
    std::string owner;
    uint64_t tag = 0;     // object_header::TagOf(key)
    uint64_t seq = 0;     // when it became resident: spilling takes the oldest first
    bool spilled = false;    // on disk only (its range given back)
    // Its spill file: kept after a restore until the value is freed, so spilling it again
    // only gives the range back.
    std::string spill_path;
  };
  // A value claimed for spilling, copied out without mu_.
  struct Victim {
    std::string key;
    uint64_t offset = 0, size = 0, seq = 0;
  };

  char* HeaderOf(const StoredObject& o) const { return arena_->data() + o.offset - object_header::kBytes; }
  std::string FullMessage(uint64_t need) const REQUIRES(mu_);
  // A range of `need` bytes (header included), spilling the oldest unpinned values until one fits.
  StatusOr<uint64_t> AllocateSpilling(uint64_t need) REQUIRES(spill_mu_) EXCLUDES(mu_);
  // A claimed resident value whose file is written: on disk only from now on.
  void MarkSpilledLocked(StoredObject& o) REQUIRES(mu_);
  // Claims the oldest resident value with no pin (nullopt when every one is pinned).
  std::optional<Victim> ClaimVictimLocked() REQUIRES(mu_);
  // The value's range back to the allocator (and its pages to the OS past the resident budget).
  void FreeRangeLocked(uint64_t value_offset) REQUIRES(mu_);
  // Freed values (freed_pinned_): those with no pin go back now (claimed first, so no stale
  // reader pins them again), the others on a later sweep; then pages past the resident budget
  // go back to the OS.
  void SweepFreedLocked() REQUIRES(mu_);

  const std::string& node_id_;  // the Node's, outlives this
  // constant after Open
  std::string name_;
  std::unique_ptr<Mapping> arena_;  // the object store; every process of the node maps it

  SpillFiles spill_;  // its directory is fixed by Open

  mutable Mutex mu_;
  Mutex spill_mu_ ACQUIRED_BEFORE(mu_);
  std::unique_ptr<ArenaAllocator> alloc_ GUARDED_BY(mu_);
  std::map<std::string, StoredObject> objects_ GUARDED_BY(mu_);  // by key
  std::map<uint64_t, std::string> resident_by_age_ GUARDED_BY(mu_);  // seq -> key
  std::map<uint64_t, uint64_t> freed_pinned_ GUARDED_BY(mu_);  // freed, range not yet back: value offset -> tag
  uint64_t next_seq_ GUARDED_BY(mu_) = 0;
  uint64_t spilled_bytes_ GUARDED_BY(mu_) = 0, spilled_objects_ GUARDED_BY(mu_) = 0;
};

}  // namespace torus
