// ObjectStore: the node's shared-memory object store as a service part (docs/object_store.md):
// the arena segment every process of the node maps, its allocator (node/arena.h) and the
// directory of the objects in it (key -> offset, size, owner). Workers reserve ranges
// (CreateObject) and write the bytes themselves; owners free them (FreeObjects); other nodes
// pull them in chunks (FetchObject).
//
// THREADS: its own mutex guards the directory and the allocator (never held with the node's
// NodeState::mu); gRPC handler threads call every method. Fetch copies out of the arena
// without the lock (an object's range is not reused while its owner may still read it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "common/shm.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "node/arena.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

class ObjectStore {
 public:
  explicit ObjectStore(const std::string& node_id) : node_id_(node_id) {}
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  // Creates the arena segment `name` of `capacity` bytes (once, from Node::Start).
  Status Open(const std::string& name, uint64_t capacity) EXCLUDES(mu_);
  const std::string& name() const { return name_; }
  uint64_t capacity() const { return arena_ ? arena_->size() : 0; }

  // CreateObject: reserves a range for the object (ALREADY_EXISTS for a key in use; a full
  // store answers with a kResourceExhausted error in the reply).
  grpc::Status Create(const rpc::CreateObjectRequest& req, rpc::CreateObjectReply* reply) EXCLUDES(mu_);
  // FreeObjects: forgets the objects and gives their ranges back (unknown keys are ignored).
  void Free(const rpc::FreeObjectsRequest& req) EXCLUDES(mu_);
  // FetchObject: streams the object's bytes in chunks (NOT_FOUND for an unknown key).
  grpc::Status Fetch(const rpc::FetchObjectRequest& req, grpc::ServerWriter<rpc::ObjectChunk>* writer)
      EXCLUDES(mu_);
  // Info's part: the objects, their bytes and the arena's capacity.
  void FillInfo(rpc::NodeInfoReply* reply) const EXCLUDES(mu_);
  struct Stats {
    uint64_t bytes = 0, objects = 0, capacity = 0;
  };
  Stats GetStats() const EXCLUDES(mu_);
  // Forgets every object (the node is stopping).
  void Clear() EXCLUDES(mu_);

 private:
  struct StoredObject {
    std::string object_id;
    uint64_t size = 0;
    uint64_t offset = 0;
    std::string owner;
  };

  const std::string& node_id_;  // the Node's, outlives this
  // constant after Open
  std::string name_;
  std::unique_ptr<Mapping> arena_;  // the object store; every process of the node maps it

  mutable Mutex mu_;
  std::unique_ptr<ArenaAllocator> alloc_ GUARDED_BY(mu_);
  std::map<std::string, StoredObject> objects_ GUARDED_BY(mu_);  // by key
};

}  // namespace torus
