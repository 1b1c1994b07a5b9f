#include "node/object_store.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/logging.h"
#include "common/rpc.h"

namespace torus {

namespace hdr = object_header;

Status ObjectStore::Open(const std::string& name, uint64_t capacity, const std::string& spill_dir) {
  if (auto s = spill_.Open(spill_dir); !s.ok()) return s;
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

std::string ObjectStore::FullMessage(uint64_t need) const {
  if (need > alloc_->capacity()) {
    return "the object store of node " + node_id_ + " is too small: the object needs " +
           std::to_string(need) + " bytes with its header, the store holds " +
           std::to_string(alloc_->capacity());
  }
  uint64_t pinned = 0;
  for (const auto& [seq, key] : resident_by_age_) {
    auto it = objects_.find(key);
    if (it != objects_.end() && hdr::Pins(HeaderOf(it->second)) > 0) ++pinned;
  }
  return "the object store of node " + node_id_ + " is full: " + std::to_string(need) +
         " bytes needed, " + std::to_string(alloc_->capacity() - alloc_->used()) + " free of " +
         std::to_string(alloc_->capacity()) + " (largest free range " +
         std::to_string(alloc_->largest_free()) + "), and the " + std::to_string(pinned) +
         " value(s) left in it are in use, so none can be spilled";
}

std::optional<ObjectStore::Victim> ObjectStore::ClaimVictimLocked() {
  for (const auto& [seq, key] : resident_by_age_) {
    auto it = objects_.find(key);
    if (it == objects_.end()) continue;
    const StoredObject& o = it->second;
    if (hdr::TryClaim(HeaderOf(o), o.tag)) return Victim{key, o.offset, o.size, seq};
  }
  return std::nullopt;
}

void ObjectStore::FreeRangeLocked(uint64_t value_offset) {
  alloc_->Free(value_offset - hdr::kBytes);
  for (const auto& [off, size] : alloc_->TakeRangesToRelease()) ReleasePages(*arena_, off, size);
}

void ObjectStore::SweepFreedLocked() {
  for (auto it = freed_pinned_.begin(); it != freed_pinned_.end();) {
    if (hdr::TryClaim(arena_->data() + it->first - hdr::kBytes, it->second)) {
      alloc_->Free(it->first - hdr::kBytes);
      it = freed_pinned_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [off, size] : alloc_->TakeRangesToRelease()) ReleasePages(*arena_, off, size);
}

void ObjectStore::MarkSpilledLocked(StoredObject& o) {
  o.spilled = true;
  resident_by_age_.erase(o.seq);
  spilled_bytes_ += o.size;
  ++spilled_objects_;
  FreeRangeLocked(o.offset);
}

StatusOr<uint64_t> ObjectStore::AllocateSpilling(uint64_t need) {
  for (;;) {
    Victim v;
    {
      MutexLock lock(mu_);
      SweepFreedLocked();
      if (auto off = alloc_->Allocate(need)) return *off;
      auto victim = ClaimVictimLocked();
      if (!victim) return Status(StatusCode::kResourceExhausted, FullMessage(need));
      v = std::move(*victim);
      StoredObject& o = objects_.at(v.key);
      if (!o.spill_path.empty()) {  // restored before: its file is still on disk
        MarkSpilledLocked(o);
        continue;
      }
    }
    // Claimed: no reader can pin it now, and nobody else spills (spill_mu_). A concurrent Free
    // may still give its range away; the file is then dropped below.
    auto path = spill_.Write(v.seq, arena_->data() + v.offset, v.size);
    MutexLock lock(mu_);
    auto it = objects_.find(v.key);
    const bool same = it != objects_.end() && it->second.seq == v.seq && !it->second.spilled &&
                      it->second.spill_path.empty();
    if (!path.ok()) {
      if (same) hdr::Unclaim(HeaderOf(it->second), it->second.tag);
      return Status(StatusCode::kResourceExhausted, "the object store of node " + node_id_ +
                                                        " is full and " + path.status().message());
    }
    if (!same) {
      spill_.Remove(*path);
      continue;
    }
    it->second.spill_path = *path;
    MarkSpilledLocked(it->second);
  }
}

grpc::Status ObjectStore::Create(const rpc::CreateObjectRequest& req, rpc::CreateObjectReply* reply) {
  if (req.key().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "CreateObject needs a key");
  }
  const uint64_t need = req.size() + hdr::kBytes;
  auto exists = [&] {
    return grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "object key " + req.key() + " exists");
  };
  std::optional<uint64_t> range;
  {
    MutexLock lock(mu_);
    if (objects_.count(req.key())) return exists();
    if (need > alloc_->capacity()) {  // refused before anything is spilled for it
      SetError(reply->mutable_error(), StatusCode::kResourceExhausted, FullMessage(need));
      return grpc::Status::OK;
    }
    range = alloc_->Allocate(need);
  }
  if (!range) {
    MutexLock spill_lock(spill_mu_);
    auto got = AllocateSpilling(need);
    if (!got.ok()) {
      SetError(reply->mutable_error(), got.status());
      return grpc::Status::OK;
    }
    range = *got;
  }
  MutexLock lock(mu_);
  if (objects_.count(req.key())) {  // created by a concurrent call meanwhile
    alloc_->Free(*range);
    return exists();
  }
  const uint64_t offset = *range + hdr::kBytes;
  StoredObject o;
  o.object_id = req.object_id();
  o.size = req.size();
  o.offset = offset;
  o.owner = req.owner_address();
  o.tag = hdr::TagOf(req.key());
  o.seq = next_seq_++;
  hdr::Init(HeaderOf(o), o.tag, /*pins=*/1);
  resident_by_age_[o.seq] = req.key();
  objects_[req.key()] = std::move(o);
  reply->set_offset(offset);
  return grpc::Status::OK;
}

void ObjectStore::Restore(const std::string& key, rpc::CreateObjectReply* reply) {
  auto fail = [&](const Status& s) {
    SetError(reply->mutable_error(), s);
  };
  auto gone = [&] { return NotFound("object key " + key + " is not in the store of node " + node_id_); };
  MutexLock spill_lock(spill_mu_);
  StoredObject want;
  {
    MutexLock lock(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return fail(gone());
    if (!it->second.spilled) {  // resident (nobody spills while we hold spill_mu_)
      if (!hdr::TryPin(HeaderOf(it->second), it->second.tag)) {
        return fail(Internal("object key " + key + " has too many readers"));
      }
      reply->set_offset(it->second.offset);
      return;
    }
    want = it->second;
  }
  auto range = AllocateSpilling(want.size + hdr::kBytes);
  if (!range.ok()) return fail(range.status());
  const uint64_t offset = *range + hdr::kBytes;
  Status read = spill_.Read(want.spill_path, arena_->data() + offset, want.size);
  MutexLock lock(mu_);
  auto it = objects_.find(key);
  const bool same = it != objects_.end() && it->second.spilled && it->second.spill_path == want.spill_path;
  if (!read.ok() || !same) {
    alloc_->Free(*range);
    return fail(!same ? gone() : read);
  }
  StoredObject& o = it->second;
  o.spilled = false;  // the file stays: spilling it again needs no write
  o.offset = offset;
  o.seq = next_seq_++;
  hdr::Init(HeaderOf(o), o.tag, /*pins=*/1);
  resident_by_age_[o.seq] = key;
  spilled_bytes_ -= o.size;
  --spilled_objects_;
  reply->set_offset(offset);
}

void ObjectStore::Abandon(const std::string& key, uint64_t offset, bool created) {
  {
    MutexLock lock(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end() || it->second.spilled || it->second.offset != offset) return;
    hdr::Unpin(HeaderOf(it->second));  // the pin the reply carried
  }
  if (created) {  // nobody learned where it is: nobody would ever free it
    rpc::FreeObjectsRequest req;
    req.add_keys(key);
    Free(req);
  }
}

void ObjectStore::Free(const rpc::FreeObjectsRequest& req) {
  MutexLock lock(mu_);
  for (const auto& key : req.keys()) {
    auto it = objects_.find(key);
    if (it == objects_.end()) continue;
    if (!it->second.spill_path.empty()) spill_.Remove(it->second.spill_path);
    if (it->second.spilled) {
      spilled_bytes_ -= it->second.size;
      --spilled_objects_;
    } else {
      resident_by_age_.erase(it->second.seq);
      // A value being spilled right now is claimed already: its range goes back now (its
      // spiller sees it gone). Any other goes back in the sweep below, or once unpinned.
      if (hdr::StatePart(hdr::At(HeaderOf(it->second)).load()) == hdr::kSpilling) {
        alloc_->Free(it->second.offset - hdr::kBytes);
      } else {
        freed_pinned_[it->second.offset] = it->second.tag;
      }
    }
    objects_.erase(it);
  }
  SweepFreedLocked();
}

grpc::Status ObjectStore::Fetch(const rpc::FetchObjectRequest& req,
                                grpc::ServerWriter<rpc::ObjectChunk>* writer) {
  uint64_t offset = 0, total = 0;
  char* pinned = nullptr;  // the header we pinned, or
  int fd = -1;             // the spill file we read
  while (!pinned && fd < 0) {
    {
      MutexLock lock(mu_);
      auto it = objects_.find(req.key());
      if (it == objects_.end()) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND,
                            "object " + req.key() + " is not in the store of node " + node_id_);
      }
      const StoredObject& o = it->second;
      offset = o.offset;
      total = o.size;
      if (o.spilled) {
        auto f = spill_.OpenForRead(o.spill_path);
        if (!f.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, f.status().message());
        fd = *f;
      } else if (hdr::TryPin(HeaderOf(o), o.tag)) {
        pinned = HeaderOf(o);
      } else if (hdr::Pins(HeaderOf(o)) == hdr::kPinMask) {
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "object " + req.key() + " has too many readers");
      }
    }
    // Neither pinnable nor in a file: it is being spilled now; wait for that spill to end.
    if (!pinned && fd < 0) {
      MutexLock wait(spill_mu_);
    }
  }
  uint64_t chunk = req.chunk_size() ? req.chunk_size() : (4u << 20);
  chunk = std::clamp<uint64_t>(chunk, 64 << 10, 64 << 20);
  uint64_t off = 0;
  const char* base = arena_->data() + offset;
  std::string buf;
  grpc::Status result = grpc::Status::OK;
  do {
    rpc::ObjectChunk c;
    c.set_offset(off);
    c.set_total_size(total);
    uint64_t n = std::min(chunk, total - off);
    if (fd >= 0) {
      buf.resize(n);
      ssize_t got = ::pread(fd, buf.data(), n, static_cast<off_t>(off));
      if (got != static_cast<ssize_t>(n)) {
        result = grpc::Status(grpc::StatusCode::INTERNAL, "reading the spilled object " + req.key() +
                                                             " failed: " + std::strerror(got < 0 ? errno : EIO));
        break;
      }
      c.set_data(std::move(buf));
    } else {
      c.set_data(base + off, n);
    }
    if (!writer->Write(c)) break;
    off += n;
  } while (off < total);
  if (pinned) hdr::Unpin(pinned);
  if (fd >= 0) ::close(fd);
  return result;
}

void ObjectStore::FillInfo(rpc::NodeInfoReply* reply) const {
  MutexLock lock(mu_);
  uint64_t bytes = 0;
  for (const auto& [key, o] : objects_) {
    if (!o.spilled) bytes += o.size;
    auto* oi = reply->add_objects();
    oi->set_object_id(o.object_id);
    oi->set_key(key);
    oi->set_offset(o.offset);
    oi->set_size(o.size);
    oi->set_owner_address(o.owner);
    oi->set_node_id(node_id_);
    oi->set_spilled(o.spilled);
  }
  reply->set_shm_bytes(bytes);
  reply->set_arena_capacity(capacity());
  reply->set_shm_objects(objects_.size() - spilled_objects_);
  reply->set_spilled_bytes(spilled_bytes_);
  reply->set_spilled_objects(spilled_objects_);
}

ObjectStore::Stats ObjectStore::GetStats() const {
  MutexLock lock(mu_);
  Stats s;
  for (const auto& [key, o] : objects_) {
    if (!o.spilled) s.bytes += o.size;
  }
  s.objects = objects_.size() - spilled_objects_;
  s.capacity = capacity();
  s.spilled_bytes = spilled_bytes_;
  s.spilled_objects = spilled_objects_;
  return s;
}

void ObjectStore::Clear() {
  MutexLock lock(mu_);
  objects_.clear();
  resident_by_age_.clear();
  freed_pinned_.clear();
  spilled_bytes_ = spilled_objects_ = 0;
  spill_.RemoveAll();
}

}  // namespace torus
