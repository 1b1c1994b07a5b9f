// CoreWorker's objects: Put, Get and Wait, storing results, materializing shared-memory
// locations, fetching borrowed values from their owners, and the GetObject service.

#include "core/core_worker.h"

#include <cxxabi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "common/env_key.h"
#include "common/ids.h"
#include "common/labels.h"
#include "common/lane.h"
#include "common/logging.h"
#include "core/store_buffers.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/thread_annotations.h"
#include "common/work_queue.h"
#include "core/conn.h"
#include "core/log_forwarder.h"
#include "core/task_record.h"
#include "tpu/chip_visibility.h"
#include "torus/api/exceptions.h"
#include "torus/api/runtime_env.h"
#include "torus/api/serializer.h"

namespace torus::core {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

// ------------------------------------------------------------------------------- objects

std::string CoreWorker::NewObjectId(int n) {
  // opts_.worker_id[0, 16) + Hex64(counter) + "@" + address_, built with one allocation.
  static const char* kDigits = "0123456789abcdef";
  uint64_t v = next_object_ + 1;
  next_object_ += static_cast<uint64_t>(n);
  std::string id;
  id.reserve(33 + address_.size());
  id.append(opts_.worker_id, 0, 16);
  char hex[16];
  for (int i = 15; i >= 0; --i, v >>= 4) hex[i] = kDigits[v & 0xf];
  id.append(hex, 16);
  id += '@';
  id += address_;
  return id;
}

std::string CoreWorker::Put(std::string bytes) { return PutBytes(std::move(bytes), {}); }

std::string CoreWorker::PutBytes(std::string bytes, std::vector<std::string> nested) {
  if (bytes.size() >= kInlineLimit) {
    // Large: through the store (PutWith collects no refs from a memcpy: add the given ones).
    std::string id =
        PutWith(bytes.size(), [&](char* dst) { internal::CopyLarge(dst, bytes.data(), bytes.size()); },
                /*may_hold_refs=*/false);
    if (!nested.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& n : nested) refs_.Entry(n).local_refs++;
      auto it = refs_.objects().find(id);
      if (it != refs_.objects().end()) it->second.L().nested = std::move(nested);
    }
    return id;
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::string id = NewObjectId();
  ObjectEntry& e = refs_.Entry(id);
  e.owned = true;
  e.ready = true;
  e.local_refs = 1;
  e.inline_data = std::make_shared<const std::string>(std::move(bytes));
  // The value keeps the objects it refers to alive (one local reference each).
  for (const auto& n : nested) refs_.Entry(n).local_refs++;
  if (!nested.empty()) e.L().nested = std::move(nested);
  return id;
}

std::string CoreWorker::PutWith(size_t size, const std::function<void(char*)>& fill,
                                bool may_hold_refs) {
  internal::RefCollector refs;
  if (size < kInlineLimit) {
    std::string bytes(size, '\0');
    if (may_hold_refs) {
      internal::CollectRefs scope(&refs);
      fill(bytes.data());
    } else {
      fill(bytes.data());
    }
    return PutBytes(std::move(bytes), std::move(refs.ids));
  }
  std::string id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = NewObjectId();
  }
  auto loc = CreateInStore(id, id, size, address_);
  if (!loc.ok()) throw internal::RayException("Put failed: " + loc.status().message());
  if (may_hold_refs) {
    internal::CollectRefs scope(&refs);
    WriteInStore(*loc, fill);
  } else {
    WriteInStore(*loc, fill);
  }
  std::lock_guard<std::mutex> lock(mu_);
  ObjectEntry& en = refs_.Entry(id);
  en.owned = true;
  en.ready = true;
  en.local_refs = 1;
  en.in_shm = true;
  en.shm = *loc;
  for (const auto& n : refs.ids) refs_.Entry(n).local_refs++;
  if (!refs.ids.empty()) en.L().nested = std::move(refs.ids);
  return id;
}

void CoreWorker::AddLocalReference(const std::string& id) {
  std::unique_lock<std::mutex> lock(mu_);
  ObjectEntry& e = refs_.Entry(id);
  e.local_refs++;
  if (e.owned || e.borrow_regs > 0) return;
  if (e.registering) {
    // Another thread is registering this process: the reference is good once it is done.
    cv_.wait(lock, [&] {
      auto it = refs_.objects().find(id);
      return it == refs_.objects().end() || !it->second.registering || shutting_down_;
    });
    return;
  }
  // A reference to an object someone else owns: register with the owner as a borrower before
  // relying on it (whoever handed it over holds it until then), so the owner keeps it for as
  // long as this process does.
  std::string owner = OwnerOf(id);
  if (owner.empty() || owner == address_ || shutting_down_) return;
  e.registering = true;
  lock.unlock();
  std::set<std::string> unknown;
  auto st = CallBorrow(owner, address_, 1, {id}, &unknown, 10000);
  lock.lock();
  cv_.notify_all();
  bool registered = st.ok() && unknown.empty();
  if (!st.ok()) {
    TORUS_LOG(WARNING) << "cannot register as a borrower of object " << id << " with its owner: "
                       << st.error_message();
  }
  // This reference holds the entry and MaybeFree skips registering entries; only Shutdown
  // (clearing every entry) can have removed it.
  auto it = refs_.objects().find(id);
  if (it == refs_.objects().end()) {
    if (registered) refs_.QueueBorrowRelease(id, 1);
    return;
  }
  it->second.registering = false;
  if (registered) it->second.borrow_regs++;
  if (it->second.local_refs <= 0 && it->second.pins <= 0) refs_.MaybeFreeAt(it);
}

void CoreWorker::RemoveLocalReference(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  refs_.RemoveLocal(id);
}

void CoreWorker::FreeInStore(ReferenceCounter::FreeRequest r) {
  // Free outside the caller's critical path: a fire-and-forget RPC on the pool.
  rpc_work_->Post([r = std::move(r), token = opts_.token] {
    rpc::FreeObjectsRequest req;
    for (auto& n : r.keys) req.add_keys(n);
    rpc::Empty e;
    auto ctx = NewContext(token, 5000);
    (void)rpc::Node::NewStub(GetChannel(r.node_address))->FreeObjects(ctx.get(), req, &e);
  });
}

void CoreWorker::StoreResult(const std::string& id, rpc::TaskResult& r) {
  auto it = refs_.objects().find(id);
  if (it == refs_.objects().end()) {
    refs_.AdoptNested(nullptr, {r.nested_ids().begin(), r.nested_ids().end()});  // give the registrations made for us back
    // Nobody holds a reference any more: drop the value (and its segment).
    if (!r.is_error() && r.value().in_shm()) {
      FreeInStore({r.value().node_address(), {r.value().key()}});
    }
    return;
  }
  ObjectEntry& e = it->second;
  e.ready = true;
  e.rebuilding = false;
  if (e.waited) {
    e.waited = false;
    cv_.notify_all();
  }
  if (r.is_error()) {
    e.is_error = true;
    e.error = r.error();
  } else if (r.value().in_shm()) {
    e.in_shm = true;
    e.shm = r.value();
  } else {
    e.inline_data =
        std::make_shared<const std::string>(std::move(*r.mutable_value()->mutable_inline_data()));
  }
  if (r.nested_ids_size() > 0) {
    // A value made again (lost objects) still holds the refs of the first: the new
    // registrations are given back.
    refs_.AdoptNested(e.ready && !e.is_error && !e.HasNested() ? &e : nullptr,
                      {r.nested_ids().begin(), r.nested_ids().end()});
  }
  OnObjectReady(id);
}

void CoreWorker::StoreTaskResult(const rpc::TaskSpec& spec, rpc::TaskResult& r) {
  const int n = spec.num_returns();
  if (n <= 1) {
    StoreResult(spec.return_id(), r);
    return;
  }
  // Taken out first: StoreResult may insert entries, and the first return's store moves r.
  auto more = std::move(*r.mutable_more_returns());
  r.clear_more_returns();
  if (!r.is_error() && more.size() != n - 1) {
    r.set_is_error(true);
    SetError(r.mutable_error(), StatusCode::kInternal,
             "task " + spec.function() + " gave " + std::to_string(more.size() + 1) +
                 " return values for num_returns=" + std::to_string(n));
  }
  const bool is_error = r.is_error();
  const rpc::Error error = is_error ? r.error() : rpc::Error();
  StoreResult(spec.return_id(), r);
  for (int i = 1; i < n; ++i) {
    rpc::TaskResult ri;
    if (is_error) {
      ri.set_is_error(true);
      *ri.mutable_error() = error;
    } else {
      rpc::ReturnValue& rv = *more.Mutable(i - 1);
      ri.mutable_value()->Swap(rv.mutable_value());
      ri.mutable_nested_ids()->Swap(rv.mutable_nested_ids());
    }
    StoreResult(ReturnIdOf(spec.return_id(), i), ri);
  }
}

void CoreWorker::FailObject(const std::string& id, StatusCode code, const std::string& msg) {
  rpc::TaskResult r;
  r.set_is_error(true);
  SetError(r.mutable_error(), code, msg);
  StoreResult(id, r);
}

bool CoreWorker::LocationOf(const std::string& id, rpc::ObjectLocation* loc, bool* is_error,
                            rpc::Error* err) {
  auto it = refs_.objects().find(id);
  if (it == refs_.objects().end() || !it->second.ready) return false;
  const ObjectEntry& e = it->second;
  *is_error = e.is_error;
  if (e.is_error) {
    *err = e.error;
  } else if (e.in_shm) {
    *loc = e.shm;
  } else {
    loc->set_inline_data(*e.inline_data);
  }
  return true;
}

void CoreWorker::EnsureFetching(const std::string& id) {
  ObjectEntry& e = refs_.Entry(id);
  if (e.ready || e.fetching || e.owned) return;
  e.fetching = true;
  SpawnTracked([this, id] { FetchFromOwner(id); });
}

void CoreWorker::FetchFromOwner(const std::string& id, bool lost, const std::string& lost_key) {
  std::string owner = OwnerOf(id);
  rpc::GetObjectReply reply;
  grpc::Status st;
  if (owner.empty()) {
    st = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed object id '" + id + "'");
  } else {
    auto stub = rpc::CoreWorker::NewStub(GetChannel(owner));
    rpc::GetObjectRequest req;
    req.set_object_id(id);
    req.set_timeout_ms(-1);
    req.set_lost(lost);
    req.set_lost_key(lost_key);
    auto ctx = TrackedContext();
    st = stub->GetObject(ctx.get(), req, &reply);
    ReleaseContext(ctx.get());
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = refs_.objects().find(id);
  if (it == refs_.objects().end()) return;
  it->second.fetching = false;
  rpc::TaskResult r;
  if (!st.ok()) {
    r.set_is_error(true);
    SetError(r.mutable_error(), StatusCode::kOwnerDied,
             "the owner of object " + id + " (" + owner + ") is unreachable (" +
                 st.error_message() + "): it died, and the object is lost with it");
  } else if (reply.is_error()) {
    r.set_is_error(true);
    *r.mutable_error() = reply.error();
  } else {
    *r.mutable_value() = reply.value();
  }
  StoreResult(id, r);  // may insert entries: `it` is stale after this
  refs_.ReleaseIfUnused(id);
}

void CoreWorker::ThrowIfError(const std::string& id, const ObjectEntry& e) {
  if (!e.is_error) return;
  auto code = static_cast<StatusCode>(e.error.code());
  const std::string& msg = e.error.message();
  switch (code) {
    case StatusCode::kTaskError: throw internal::RayTaskException(msg);
    case StatusCode::kActorDied: throw internal::RayActorException(msg);
    case StatusCode::kWorkerDied: throw internal::RayWorkerException(msg);
    case StatusCode::kNotFound: throw internal::RayFunctionNotFound(msg);
    case StatusCode::kSliceLost: throw internal::RaySliceLostException(msg);
    case StatusCode::kCancelled: throw internal::TaskCancelledException(msg);
    case StatusCode::kOwnerDied: throw internal::OwnerDiedException(msg);
    default: throw internal::UnreconstructableException(msg);
  }
}

void CoreWorker::BlockedScope::Block() {
  // Only a thread running a task holds the lease's CPU to lend and has tasks queued behind it
  // (as in Ray, whose task context is per thread): a thread of the program's own (an async
  // actor's event loop waiting through a pool, a thread a task started) blocks without telling
  // the node, which would otherwise cost two node calls per wait.
  if (CurrentTaskId().empty()) return;
  YieldQueuedTasks();  // nothing this task waits for may wait behind it on this worker
  cw->SetBlocked(true);
  on = true;
}

CoreWorker::BlockedScope::~BlockedScope() {
  if (on) cw->SetBlocked(false);
}

void CoreWorker::SetBlocked(bool blocked) {
  if (opts_.is_driver) return;
  rpc::BlockedRequest req;
  req.set_worker_id(opts_.worker_id);
  req.set_blocked(blocked);
  rpc::Empty e;
  auto ctx = NewContext(opts_.token, 5000);
  (void)node_->NotifyBlocked(ctx.get(), req, &e);
}

// Which of a Get's ids are ready: ids[0, cursor) were when last looked at. A wait sleeps until
// the first id that is not ready is stored (StoreResult wakes the waiters of entries marked
// `waited`), so a Get of many refs neither wakes on every result nor rescans every id each
// time. Once the cursor reaches the end, one full pass confirms that all are ready; it also
// records each entry for the reads after it (no lookups then: mu_ is held from it to them).
struct CoreWorker::ReadyScan {
  ReadyScan(ReferenceCounter& r, const std::vector<std::string>& i)
      : refs(r), ids(i), entries(i.size()) {}
  bool AllReady() {
    for (bool verified = false;; verified = true) {
      for (; cursor < ids.size(); ++cursor) {
        ObjectEntry* e = refs.Find(ids[cursor]);
        if (!e || !e->ready) {
          if (e) e->waited = true;
          return false;
        }
        entries[cursor] = e;
      }
      if (verified) return true;
      cursor = 0;
    }
  }
  ReferenceCounter& refs;
  const std::vector<std::string>& ids;
  size_t cursor = 0;
  std::vector<ObjectEntry*> entries;
};

namespace {
// A store view that holds a local reference to its object until it goes.
class PinnedBuffer final : public internal::Buffer {
 public:
  PinnedBuffer(std::shared_ptr<internal::Buffer> view, std::string id)
      : view_(std::move(view)), id_(std::move(id)) {}
  ~PinnedBuffer() override {
    if (internal::Runtime* rt = internal::GetRuntime()) {
      try {
        rt->RemoveLocalReference(id_);
      } catch (const std::exception&) {  // a destructor must not throw
      }
    }
  }
  const char* data() const override { return view_->data(); }
  size_t size() const override { return view_->size(); }

 private:
  std::shared_ptr<internal::Buffer> view_;
  std::string id_;
};
}  // namespace

std::vector<std::shared_ptr<internal::Buffer>> CoreWorker::Get(const std::vector<std::string>& ids,
                                                               int timeout_ms) {
  auto deadline = timeout_ms < 0 ? Clock::time_point::max()
                                 : Clock::now() + std::chrono::milliseconds(timeout_ms);
  // A value whose node is gone is rebuilt (or fetched again from its owner) and read again; a
  // node that cannot be read but is not declared dead yet is waited for (RecoverLost says how
  // long).
  for (;;) {
    std::vector<LostRead> lost;
    auto out = GetRound(ids, deadline, timeout_ms, &lost);
    if (lost.empty()) return out;
    out.clear();  // let go of what was read before waiting
    if (RecoverLost(lost)) continue;
    auto now = Clock::now();
    if (now >= deadline) {
      throw internal::RayTimeoutException("Get timed out: object " + lost[0].id +
                                          " cannot be read yet (" + lost[0].message + ")");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(250), deadline - now));
  }
}

std::shared_ptr<internal::Buffer> CoreWorker::GetOne(const std::string& id, int timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const ObjectEntry* e = refs_.Find(id);
    // What Get would do for such a value: no fetch to start, no wait, no pin, nothing to release.
    if (e && e->ready && e->owned && !e->in_shm) {
      ThrowIfError(id, *e);
      if (e->inline_data) return std::make_shared<InlineBuffer>(e->inline_data);
    }
  }
  std::vector<std::shared_ptr<internal::Buffer>> out = Get({id}, timeout_ms);
  return out.size() == 1 ? std::move(out[0]) : nullptr;
}

std::vector<std::shared_ptr<internal::Buffer>> CoreWorker::GetRound(
    const std::vector<std::string>& ids, Clock::time_point deadline, int timeout_ms,
    std::vector<LostRead>* lost) {
  std::vector<std::shared_ptr<internal::Buffer>> out(ids.size());
  std::vector<std::pair<size_t, rpc::ObjectLocation>> to_map;
  std::vector<size_t> local;  // values in this node's store, read in place
  // Borrowed entries are pinned while this Get reads them: one made for it (a task argument the
  // worker holds no ObjectRef to) would otherwise be dropped by its fetch thread the moment the
  // value arrives, and the Get would wait for it for ever. Unpinned last, after the reads (also
  // when a read throws): an entry nothing else holds is freed then — an inline value's bytes
  // live on in the returned buffer, a store value's in the local reference its view takes.
  struct Held {
    CoreWorker* cw;
    std::vector<std::string> ids;
    ~Held() {
      if (ids.empty()) return;
      std::lock_guard<std::mutex> lock(cw->mu_);
      for (const auto& id : ids) cw->refs_.Unpin(id);
    }
  } held{this, {}};
  // A worker blocked in Get tells its node (which may then start another worker); it is
  // unblocked when this goes, after mu_ is released.
  BlockedScope blocked{this};
  {
    std::unique_lock<std::mutex> lock(mu_);
    StartFetches(ids);
    for (const auto& id : ids) {
      ObjectEntry* e = refs_.Find(id);
      if (!e || e->owned) continue;
      refs_.Pin(id);
      held.ids.push_back(id);
    }
    ReadyScan scan(refs_, ids);
    if (!scan.AllReady()) {
      if (!opts_.is_driver) {
        lock.unlock();
        blocked.Block();
        lock.lock();
      }
      WaitAllReady(lock, scan, deadline, timeout_ms);
    }
    ReadValues(scan, &out, &to_map);
    for (size_t i = 0; i < ids.size(); ++i) {
      // (A local value whose pin failed is read by Materialize below, from to_map.)
      if (out[i] && scan.entries[i]->in_shm && scan.entries[i]->shm.node_id() == node_id_) local.push_back(i);
    }
  }
  // A view of the store pins its object (one local reference) for as long as the view lives,
  // so memory a reader still looks at is never freed and reused (zero-copy numpy arrays
  // outlive their ObjectRef).
  for (size_t i : local) {
    AddLocalReference(ids[i]);
    out[i] = std::make_shared<PinnedBuffer>(std::move(out[i]), ids[i]);
  }
  for (auto& [i, loc] : to_map) {
    auto b = Materialize(loc, ids[i]);
    if (!b.ok()) {
      lost->push_back({ids[i], loc, b.status().message()});
      continue;
    }
    AddLocalReference(ids[i]);
    out[i] = std::make_shared<PinnedBuffer>(std::move(*b), ids[i]);
  }
  return out;
}

void CoreWorker::StartFetches(const std::vector<std::string>& ids) {
  for (const auto& id : ids) {
    ObjectEntry* e = refs_.Find(id);
    if (!e) {
      if (OwnerOf(id) == address_) {
        throw internal::UnreconstructableException("object " + id +
                                                   " was freed: no ObjectRef to it was held");
      }
      refs_.Entry(id);  // a temporary borrowed entry; erased below if nobody refers to it
      EnsureFetching(id);
    } else if (!e->ready && !e->fetching && !e->owned) {
      EnsureFetching(id);
    }
  }
}

namespace {
// The synchronous call this thread sent last (CoreWorker::NoteSyncCall).
struct SyncCall {
  std::weak_ptr<Conn> conn;
  uint64_t task = 0;
};
thread_local SyncCall tl_sync_call;

// The task counter of the task that returns `id` first (its ids are "<worker><counter>@owner").
uint64_t TaskCounterOfReturn(const std::string& id) {
  std::string_view hex(id);
  return TaskCounterOf(hex.substr(0, hex.find('@')));
}
}  // namespace

void CoreWorker::NoteSyncCall(const std::shared_ptr<Conn>& conn, uint64_t task) {
  tl_sync_call.conn = conn;
  tl_sync_call.task = task;
}

CoreWorker::SyncRead CoreWorker::ReadSyncReply(std::unique_lock<std::mutex>& lock,
                                                const std::string& id,
                                                Clock::time_point deadline, const Conn** mine) {
  // How long one read here waits before the reader thread takes over (a long call then costs
  // one more wake-up, which its length dwarfs).
  constexpr auto kSlice = std::chrono::milliseconds(5);
  SyncCall& sc = tl_sync_call;
  if (sc.task == 0 || sc.task != TaskCounterOfReturn(id)) return SyncRead::kNotTried;
  const ObjectEntry* e = refs_.Find(id);
  if (!e || !e->owned) return SyncRead::kNotTried;  // a borrowed id with the same counter
  std::shared_ptr<Conn> conn = sc.conn.lock();
  if (!conn || !conn->CanReadHere()) return SyncRead::kNotTried;
  const uint64_t task = sc.task;
  auto in_flight_here = [&] { return !conn->broken && conn->in_flight.count(task) > 0; };
  if (!in_flight_here()) return SyncRead::kNotTried;
  auto slice = kSlice;
  if (deadline != Clock::time_point::max()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return SyncRead::kNotTried;
    slice = std::min(slice, left);
  }
  lock.unlock();
  bool again = conn->ReadHere(
      [&] {
        std::lock_guard<std::mutex> l(mu_);
        return in_flight_here();
      },
      slice);
  if (!again) *mine = conn.get();  // compared, never dereferenced
  conn.reset();  // never the last reference under mu_ (~Conn joins the reader, which takes mu_)
  lock.lock();
  return again ? SyncRead::kAgain : SyncRead::kFailed;
}

void CoreWorker::UnparkReaders(const Conn* except) {
  for (auto& c : conns_) {
    if (c.get() != except) c->Unpark();
  }
}

void CoreWorker::WaitAllReady(std::unique_lock<std::mutex>& lock, ReadyScan& scan,
                              Clock::time_point deadline, int timeout_ms) {
  bool unparked = false;
  bool read_failed = false;
  const Conn* mine = nullptr;
  while (!scan.AllReady()) {
    if (shutting_down_) throw internal::RayException("ray::Shutdown() was called during Get");
    if (scan.ids.size() == 1 && !read_failed) {
      // The lock was released either way: look for the value again before sleeping.
      auto r = ReadSyncReply(lock, scan.ids[0], deadline, &mine);
      if (r == SyncRead::kAgain) continue;
      if (r == SyncRead::kFailed) {
        read_failed = true;  // the reader thread delivers it; wait on cv_ from now on
        continue;
      }
    }
    if (!unparked) {
      UnparkReaders(mine);
      unparked = true;
    }
    if (deadline == Clock::time_point::max()) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !scan.AllReady()) {
      std::string which = DescribeNotReady(scan.ids);
      lock.unlock();
      throw internal::RayTimeoutException("Get timed out: some object(s) not ready after " +
                                          std::to_string(timeout_ms) + " ms (" + which + ")");
    }
  }
}

std::string CoreWorker::DescribeNotReady(const std::vector<std::string>& ids) {
  std::string out;
  int shown = 0, missing = 0;
  for (const auto& id : ids) {
    const ObjectEntry* e = refs_.Find(id);
    if (e && e->ready) continue;
    if (++missing > 3) continue;
    if (shown++) out += "; ";
    out += id + ": ";
    if (!e) {
      out += "unknown here";
      continue;
    }
    if (e->owned) {
      out += e->rebuilding ? "ours, being made again" : e->evicted ? "ours, evicted" : "ours, its task has not finished";
    } else {
      out += e->fetching ? "borrowed, its owner has not answered" : "borrowed, not being fetched";
    }
  }
  if (missing > 3) out += "; and " + std::to_string(missing - 3) + " more";
  return "not ready: " + out;
}

void CoreWorker::ReadValues(ReadyScan& scan, std::vector<std::shared_ptr<internal::Buffer>>* out,
                            std::vector<std::pair<size_t, rpc::ObjectLocation>>* to_map) {
  const auto& ids = scan.ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    ObjectEntry& e = *scan.entries[i];
    ThrowIfError(ids[i], e);
    if (e.in_shm && e.shm.node_id() == node_id_ && PinLocal(e.shm)) {
      (*out)[i] = std::make_shared<ArenaBuffer>(arena_, e.shm.offset(), e.shm.size());
    } else if (e.in_shm) {
      to_map->emplace_back(i, e.shm);
    } else {
      (*out)[i] = std::make_shared<InlineBuffer>(e.inline_data);
    }
  }
}

std::vector<bool> CoreWorker::Wait(const std::vector<std::string>& ids, int num_objects,
                                   int timeout_ms) {
  if (num_objects < 0 || num_objects > static_cast<int>(ids.size())) {
    throw internal::RayException("Wait: num_objects (" + std::to_string(num_objects) +
                                 ") must be between 0 and the number of refs (" +
                                 std::to_string(ids.size()) + ")");
  }
  auto deadline = timeout_ms < 0 ? Clock::time_point::max()
                                 : Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::vector<bool> ready(ids.size(), false);
  bool unparked = false;
  // A worker that waits lends its CPU and hands back the tasks queued behind it, as in Get.
  BlockedScope blocked{this};
  std::unique_lock<std::mutex> lock(mu_);
  for (const auto& id : ids) {
    if (!refs_.objects().count(id) && OwnerOf(id) != address_) refs_.Entry(id);
    if (refs_.objects().count(id)) EnsureFetching(id);
  }
  while (true) {
    int n = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = refs_.objects().find(ids[i]);
      ready[i] = it == refs_.objects().end() ? OwnerOf(ids[i]) == address_ : it->second.ready;
      n += ready[i];
    }
    if (n >= num_objects || shutting_down_) break;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ready[i]) continue;
      auto it = refs_.objects().find(ids[i]);
      if (it != refs_.objects().end()) it->second.waited = true;
    }
    if (!unparked) {
      UnparkReaders();
      unparked = true;
      if (!opts_.is_driver && timeout_ms != 0) {
        lock.unlock();
        blocked.Block();
        lock.lock();
        continue;  // look again: what came meanwhile was not waited for
      }
    }
    if (deadline == Clock::time_point::max()) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      for (size_t i = 0; i < ids.size(); ++i) {
        auto it = refs_.objects().find(ids[i]);
        ready[i] = it != refs_.objects().end() && it->second.ready;
      }
      break;
    }
  }
  return ready;
}

grpc::Status CoreWorker::GetObject(grpc::ServerContext* ctx, const rpc::GetObjectRequest* req,
                                   rpc::GetObjectReply* reply) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  {
    std::unique_lock<std::mutex> lock(ready_mu_);
    ready_cv_.wait(lock, [this] { return ready_; });
  }
  auto deadline = req->timeout_ms() < 0 ? Clock::time_point::max()
                                        : Clock::now() + std::chrono::milliseconds(req->timeout_ms());
  if (req->lost()) RebuildForBorrower(req->object_id(), req->lost_key());
  const auto began = Clock::now();
  bool warned = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto it = refs_.objects().find(req->object_id());
    if (it == refs_.objects().end() || !it->second.owned) {
      reply->set_ready(true);
      reply->set_is_error(true);
      SetError(reply->mutable_error(), StatusCode::kUnavailable,
               "object " + req->object_id() + " is unknown to its owner (already freed)");
      return grpc::Status::OK;
    }
    bool is_error = false;
    if (LocationOf(req->object_id(), reply->mutable_value(), &is_error, reply->mutable_error())) {
      reply->set_ready(true);
      reply->set_is_error(is_error);
      return grpc::Status::OK;
    }
    if (ctx->IsCancelled() || shutting_down_ || Clock::now() >= deadline) return grpc::Status::OK;
    if (!warned && Clock::now() - began > std::chrono::seconds(30)) {
      warned = true;  // evidence for a borrower that waits long (a slow task, or a stuck rebuild)
      TORUS_LOG(WARNING) << "a borrower has waited 30 s for object " << req->object_id() << ": "
                         << DescribeNotReady({req->object_id()});
    }
    it->second.waited = true;
    UnparkReaders();
    cv_.wait_for(lock, std::chrono::milliseconds(100));
  }
}

}  // namespace torus::core
