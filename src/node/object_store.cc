#include "node/object_store.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "common/logging.h"

namespace torus {

Status ObjectStore::Open(const std::string& name, uint64_t capacity) {
  auto arena = CreateSparseSegment(name, capacity);
  if (!arena.ok()) return arena.status();
  name_ = name;
  arena_ = std::move(*arena);
  // Freed bytes kept resident for reuse: min(capacity / 4, 2 GiB), or
  // TORUS_OBJECT_STORE_RESIDENT_FREE_BYTES (0 = give every freed page back at once).
  uint64_t resident_free = std::min<uint64_t>(capacity / 4, 2ull << 30);
  if (const char* v = getenv("TORUS_OBJECT_STORE_RESIDENT_FREE_BYTES"); v && *v) {
    char* end = nullptr;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno == 0 && end && *end == '\0' && v[0] != '-') {
      resident_free = n;
    } else {
      TORUS_LOG(WARNING) << "TORUS_OBJECT_STORE_RESIDENT_FREE_BYTES='" << v
                         << "' is not a byte count; keeping " << resident_free << " bytes resident";
    }
  }
  MutexLock lock(mu_);
  alloc_ = std::make_unique<ArenaAllocator>(capacity, resident_free);
  return Status::Ok();
}

grpc::Status ObjectStore::Create(const rpc::CreateObjectRequest& req, rpc::CreateObjectReply* reply) {
  if (req.key().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "CreateObject needs a key");
  }
  MutexLock lock(mu_);
  if (objects_.count(req.key())) {
    return grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "object key " + req.key() + " exists");
  }
  auto off = alloc_->Allocate(req.size());
  if (!off) {
    reply->mutable_error()->set_code(static_cast<int>(StatusCode::kResourceExhausted));
    reply->mutable_error()->set_message(
        "the object store of node " + node_id_ + " is full: " + std::to_string(req.size()) +
        " bytes needed, " + std::to_string(alloc_->capacity() - alloc_->used()) + " free of " +
        std::to_string(alloc_->capacity()) + " (largest free range " +
        std::to_string(alloc_->largest_free()) + ")");
    return grpc::Status::OK;
  }
  objects_[req.key()] = {req.object_id(), req.size(), *off, req.owner_address()};
  reply->set_offset(*off);
  return grpc::Status::OK;
}

void ObjectStore::Free(const rpc::FreeObjectsRequest& req) {
  MutexLock lock(mu_);
  for (const auto& key : req.keys()) {
    auto it = objects_.find(key);
    if (it == objects_.end()) continue;
    alloc_->Free(it->second.offset);
    objects_.erase(it);
  }
  for (const auto& [off, size] : alloc_->TakeRangesToRelease()) ReleasePages(*arena_, off, size);
}

grpc::Status ObjectStore::Fetch(const rpc::FetchObjectRequest& req,
                                grpc::ServerWriter<rpc::ObjectChunk>* writer) {
  uint64_t offset = 0, total = 0;
  {
    MutexLock lock(mu_);
    auto it = objects_.find(req.key());
    if (it == objects_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "object " + req.key() + " is not in the store of node " + node_id_);
    }
    offset = it->second.offset;
    total = it->second.size;
  }
  uint64_t chunk = req.chunk_size() ? req.chunk_size() : (4u << 20);
  chunk = std::clamp<uint64_t>(chunk, 64 << 10, 64 << 20);
  uint64_t off = 0;
  const char* base = arena_->data() + offset;
  do {
    rpc::ObjectChunk c;
    c.set_offset(off);
    c.set_total_size(total);
    uint64_t n = std::min(chunk, total - off);
    c.set_data(base + off, n);
    if (!writer->Write(c)) break;
    off += n;
  } while (off < total);
  return grpc::Status::OK;
}

void ObjectStore::FillInfo(rpc::NodeInfoReply* reply) const {
  MutexLock lock(mu_);
  uint64_t bytes = 0;
  for (const auto& [key, o] : objects_) {
    bytes += o.size;
    auto* oi = reply->add_objects();
    oi->set_object_id(o.object_id);
    oi->set_key(key);
    oi->set_offset(o.offset);
    oi->set_size(o.size);
    oi->set_owner_address(o.owner);
    oi->set_node_id(node_id_);
  }
  reply->set_shm_bytes(bytes);
  reply->set_arena_capacity(capacity());
  reply->set_shm_objects(objects_.size());
}

ObjectStore::Stats ObjectStore::GetStats() const {
  MutexLock lock(mu_);
  Stats s;
  for (const auto& [key, o] : objects_) s.bytes += o.size;
  s.objects = objects_.size();
  s.capacity = capacity();
  return s;
}

void ObjectStore::Clear() {
  MutexLock lock(mu_);
  objects_.clear();
}

}  // namespace torus
