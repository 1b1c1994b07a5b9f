// CoreWorker, the node's object store from this process's side (docs/object_store.md): reserving
// a range, reading a value in place under a pin, asking the node to restore a spilled value, and
// pulling a value from another node into this one.
#include <cstring>
#include <optional>

#include "common/ids.h"
#include "common/object_header.h"
#include "common/rpc.h"
#include "core/core_worker.h"
#include "core/store_buffers.h"

namespace torus::core {

StatusOr<rpc::ObjectLocation> CoreWorker::CreateInStore(const std::string& object_id,
                                                       const std::string& key, uint64_t size,
                                                       const std::string& owner) {
  rpc::CreateObjectRequest req;
  req.set_object_id(object_id);
  req.set_key(key);
  req.set_size(size);
  req.set_owner_address(owner);
  rpc::CreateObjectReply reply;
  // Generous: a full store spills (at disk speed) before it answers. A node that answers after
  // the deadline frees what it made (Node::CreateObject).
  auto ctx = NewContext(opts_.token, 120000);
  auto st = node_->CreateObject(ctx.get(), req, &reply);
  if (!st.ok()) return FromGrpc(st, "the node refused to store object " + object_id);
  auto offset = PinnedOffset(reply, size);
  if (!offset.ok()) return offset.status();
  rpc::ObjectLocation loc = StoreLocation(key, node_id_, opts_.node_address);
  loc.set_offset(*offset);
  loc.set_size(size);
  return loc;
}

StatusOr<uint64_t> CoreWorker::PinnedOffset(const rpc::CreateObjectReply& reply, uint64_t size) const {
  if (reply.has_error() && reply.error().code() != 0) {
    return Status(static_cast<StatusCode>(reply.error().code()), reply.error().message());
  }
  if (!InArena(reply.offset(), size)) return Internal("node returned an offset out of range");
  return reply.offset();
}

bool CoreWorker::InArena(uint64_t offset, uint64_t size) const {
  return offset >= object_header::kBytes && offset + size <= arena_->size();
}

bool CoreWorker::PinLocal(const rpc::ObjectLocation& loc) {
  if (!InArena(loc.offset(), loc.size())) return false;
  return object_header::TryPin(arena_->data() + loc.offset() - object_header::kBytes,
                               object_header::TagOf(loc.key()));
}

void CoreWorker::UnpinLocal(uint64_t offset) {
  object_header::Unpin(arena_->data() + offset - object_header::kBytes);
}

void CoreWorker::WriteInStore(const rpc::ObjectLocation& loc, const std::function<void(char*)>& write) {
  try {
    write(arena_->data() + loc.offset());
  } catch (...) {
    UnpinLocal(loc.offset());
    FreeInStore({opts_.node_address, {loc.key()}});
    throw;
  }
  UnpinLocal(loc.offset());  // written: the node may spill it from now on
}

StatusOr<std::shared_ptr<internal::Buffer>> CoreWorker::ReadLocal(const rpc::ObjectLocation& loc,
                                                                  const std::string& object_id) {
  if (PinLocal(loc)) {
    return std::shared_ptr<internal::Buffer>(std::make_shared<ArenaBuffer>(arena_, loc.offset(), loc.size()));
  }
  // Spilled (or moved by a restore): the node brings it back and pins it for us.
  rpc::RestoreObjectRequest req;
  req.set_key(loc.key());
  rpc::CreateObjectReply reply;
  auto ctx = NewContext(opts_.token);
  auto st = node_->RestoreObject(ctx.get(), req, &reply);
  if (!st.ok()) return FromGrpc(st, "the node could not restore object " + object_id);
  auto offset = PinnedOffset(reply, loc.size());
  if (!offset.ok()) {
    return Status(offset.status().code(), "cannot read object " + object_id + ": " + offset.status().message());
  }
  {
    // Remember where it is now, so the next read pins it directly.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = refs_.objects().find(object_id);
    if (it != refs_.objects().end()) {
      ObjectEntry& e = it->second;
      if (e.in_shm && e.shm.key() == loc.key()) e.shm.set_offset(*offset);
      if (e.has_local_copy && e.local_copy.key() == loc.key()) e.local_copy.set_offset(*offset);
    }
  }
  return std::shared_ptr<internal::Buffer>(std::make_shared<ArenaBuffer>(arena_, *offset, loc.size()));
}

StatusOr<std::shared_ptr<internal::Buffer>> CoreWorker::Materialize(const rpc::ObjectLocation& loc,
                                                                    const std::string& object_id) {
  if (!loc.in_shm()) {
    return std::shared_ptr<internal::Buffer>(
        std::make_shared<InlineBuffer>(std::make_shared<const std::string>(loc.inline_data())));
  }
  if (loc.node_id() == node_id_) return ReadLocal(loc, object_id);
  {
    // Already pulled to this node by this process?
    std::optional<rpc::ObjectLocation> copy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = refs_.objects().find(object_id);
      if (it != refs_.objects().end() && it->second.has_local_copy) copy = it->second.local_copy;
    }
    if (copy) return ReadLocal(*copy, object_id);
  }
  // Pull from the node that holds it, in chunks, into this node's store.
  auto local = CreateInStore(object_id, HexOf(object_id) + ".copy." + RandomHex(4), loc.size(),
                             OwnerOf(object_id));
  if (!local.ok()) return local.status();
  auto free_local = [&] {
    UnpinLocal(local->offset());
    FreeInStore({opts_.node_address, {local->key()}});
  };
  auto stub = NodeStub(loc.node_address());
  rpc::FetchObjectRequest req;
  req.set_key(loc.key());
  req.set_chunk_size(4 << 20);
  auto ctx = NewContext(opts_.token);
  auto reader = stub->FetchObject(ctx.get(), req);
  rpc::ObjectChunk chunk;
  uint64_t got = 0;
  char* dst = arena_->data() + local->offset();
  while (reader->Read(&chunk)) {
    if (chunk.offset() + chunk.data().size() > loc.size()) break;
    memcpy(dst + chunk.offset(), chunk.data().data(), chunk.data().size());
    got += chunk.data().size();
  }
  auto st = reader->Finish();
  if (!st.ok() || got != loc.size()) {
    free_local();
    return Status(StatusCode::kUnavailable, "cannot pull object " + object_id + " from node " +
                                                loc.node_address() + ": " +
                                                (st.ok() ? "short read" : st.error_message()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = refs_.objects().find(object_id);
    if (it != refs_.objects().end() && !it->second.has_local_copy) {
      it->second.has_local_copy = true;
      it->second.local_copy = *local;
      // The buffer takes over the writer's pin.
      return std::shared_ptr<internal::Buffer>(
          std::make_shared<ArenaBuffer>(arena_, local->offset(), local->size()));
    }
  }
  // Nobody left to remember the copy: hand back an owned copy of the bytes and free the slot.
  auto bytes = std::make_shared<const std::string>(dst, loc.size());
  free_local();
  return std::shared_ptr<internal::Buffer>(std::make_shared<InlineBuffer>(bytes));
}

}  // namespace torus::core
