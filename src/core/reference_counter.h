// Reference counting of the objects a core worker knows (docs/objects.md): for each object id,
// the local references of this process, the in-flight tasks that pin it, the processes that
// borrow it from us (owner side) and the registrations we hold at its owner (borrower side).
// Decides when an entry is freed, which store segments that frees, and which borrow
// registrations must be given back; it makes no RPC itself. The owner of this object sends
// what it decided through the two hooks.
//
// Contract: an entry is freed once nothing holds it: no local reference, no pin, no borrower,
// no registration on its way and (borrowed objects) no fetch in flight. Freeing an entry
// releases the local reference its value held on each ref nested in it, which may free those
// in turn. Freeing a borrowed entry queues the release of its registrations at the owner.
//
// Lineage (owner side, docs/objects.md "Lost objects"): an owned task result may keep the
// finished task that made it (SetLineage), so it can be made again when its only copy is lost.
// Each owned argument of such a task counts one lineage reference. An entry that nothing holds
// but lineage references is kept as it is when its value is small (inline, or an error: it
// cannot be lost); a stored one with lineage of its own is evicted instead of freed: its value
// goes, the entry and its lineage stay, so a rebuild can rebuild it first. An entry is
// freed once no lineage reference is left either; freeing one releases its arguments' lineage
// references, which may free those in turn. Lineage kept is bounded by bytes (SetLineage
// refuses past the budget).
//
// THREADS: not thread-safe. The owning CoreWorker calls every method with its `mu_` held (the
// same lock guards object readiness and the submit queues, which change together with the
// counts), so this class has no lock of its own. The hooks are called with that lock held:
// they must not block or call back into this object.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "proto/torus.pb.h"

namespace torus::core {

struct TaskRecord;

// Values at least this large live in shared memory; smaller ones travel inline.
inline constexpr size_t kInlineLimit = 100 * 1024;

// "<hex>@host:port" -> owner address ("" when the id names none).
std::string OwnerOf(const std::string& id);
// "<hex>@host:port" -> "<hex>".
std::string HexOf(const std::string& id);
// Return `index` (0-based) of a task whose first return is `first`: the ids of a task's returns
// are consecutive (CoreWorker::NewObjectId(n) reserves n), "<worker:16><counter:16>@owner", so
// each is derived from the first and none travels on the wire. index 0 gives `first`.
std::string ReturnIdOf(const std::string& first, int index);

// A value's place in the store of node `node_id` (at `node_address`), under `key`.
rpc::ObjectLocation StoreLocation(const std::string& key, const std::string& node_id,
                                  const std::string& node_address);

// What this process knows of one object: its value (once ready) and its counts.
struct ObjectEntry {
  bool owned = false;
  bool ready = false;
  bool is_error = false;
  rpc::Error error;
  std::shared_ptr<const std::string> inline_data;
  rpc::ObjectLocation shm;  // valid when in_shm
  bool in_shm = false;
  rpc::ObjectLocation local_copy;    // a copy this process pulled into its own node's store
  bool has_local_copy = false;
  int local_refs = 0;
  int pins = 0;  // in-flight tasks that take it as an argument
  bool fetching = false;
  bool waited = false;  // a Get/Wait/GetObject sleeps on cv_ until this one is ready
  // Borrowed references (docs/objects.md).
  bool registering = false;  // borrower: our registration with the owner is on its way
  int borrow_regs = 0;       // borrower: registrations we hold at the owner
  // Allocated only for values that hold refs or objects that have borrowers, so the common entry
  // stays small.
  struct Links {
    std::vector<std::string> nested;  // refs inside this value, each held by one local ref
    std::vector<std::pair<std::string, int>> borrowers;  // owner: registrations by address
  };
  std::unique_ptr<Links> links;
  Links& L() {
    if (!links) links = std::make_unique<Links>();
    return *links;
  }
  bool HasBorrowers() const { return links && !links->borrowers.empty(); }
  bool HasNested() const { return links && !links->nested.empty(); }
  // Nothing in this process holds it (its borrowers may still).
  bool Unused() const { return local_refs <= 0 && pins <= 0; }
  // Lineage (owner): the finished task that made this value, with the owned arguments it holds
  // a lineage reference on; null when the value cannot be made again (a Put, an actor call, a
  // task without retries left, or over the lineage budget).
  struct Lineage {
    std::shared_ptr<TaskRecord> task;
    std::vector<std::string> args;
    size_t bytes = 0;
  };
  std::shared_ptr<Lineage> lineage;
  int lineage_refs = 0;     // kept tasks (of other entries' lineage) that take it as an argument
  bool evicted = false;     // kept only for lineage: no value (not ready)
  bool rebuilding = false;  // its task runs again (CoreWorker::Rebuild); cleared when stored
};

class ReferenceCounter {
 public:
  using Map = std::unordered_map<std::string, ObjectEntry>;
  // Store segments to free: `keys` in the store of the node at `node_address`.
  struct FreeRequest {
    std::string node_address;
    std::vector<std::string> keys;
  };
  struct Hooks {
    std::function<void(FreeRequest)> free;   // segments of a freed entry
    std::function<void()> releases_queued;   // TakePendingReleases() has something
  };
  // Owner side: a process registered as a borrower of our objects, for the liveness probe.
  struct BorrowerState {
    int regs = 0;      // registrations held, over all objects
    int refused = 0;   // consecutive probes refused (UNAVAILABLE)
    int timeouts = 0;  // consecutive probes timed out
  };
  // Registrations to give back, per owner address: (object id, count).
  using Releases = std::unordered_map<std::string, std::vector<std::pair<std::string, int>>>;

  explicit ReferenceCounter(Hooks hooks) : hooks_(std::move(hooks)) {}
  // Who we are: our address (ids we own end in it) and our node (whose store we free directly).
  void SetIdentity(std::string self_address, std::string node_id, std::string node_address);

  // The entries, for the object store's reads (readiness, values, locations).
  Map& objects() { return objects_; }
  // The entry of `id`, created empty if absent.
  ObjectEntry& Entry(const std::string& id) { return objects_[id]; }
  ObjectEntry* Find(const std::string& id);

  // Counting. Each Release* frees the entry when nothing holds it any more.
  void AddLocal(const std::string& id) { Entry(id).local_refs++; }
  void RemoveLocal(const std::string& id);  // one local reference fewer
  void Pin(const std::string& id) { Entry(id).pins++; }
  void Unpin(const std::string& id);        // one pin fewer
  void ReleaseIfUnused(const std::string& id);  // frees it if unused (no count changes)
  void MaybeFree(const std::string& id);
  void MaybeFreeAt(Map::iterator it);

  // Owner side: borrower `addr` holds `delta` more (or fewer) registrations of the entry.
  // Returns true when the entry lost its last borrower.
  bool AdjustBorrower(ObjectEntry& e, const std::string& addr, int delta);
  // The owned objects `ids` that borrower `addr` registers for (`delta` > 0) or gives back.
  // Unknown ids (not ours, or already freed) are added to *unknown.
  void BorrowObjects(const std::string& addr, int delta, const std::vector<std::string>& ids,
                     std::vector<std::string>* unknown);
  std::vector<std::string> BorrowerAddresses() const;
  BorrowerState* FindBorrower(const std::string& addr);
  // Drops every registration of a borrower that is gone; frees what only it held.
  void DropBorrower(const std::string& addr);
  // The outcome of a liveness probe of borrower `addr`. A borrower that refused twice in a row
  // (nothing listens on its port: the process is gone) or timed out ten times in a row (a
  // vanished host) is dropped (DropBorrower); then returns true with *regs its registrations.
  enum class ProbeOutcome { kAnswered, kRefused, kTimedOut };
  bool OnProbe(const std::string& addr, ProbeOutcome outcome, int* regs);
  // The refs inside a task's result, registered for us by the executor: `outer` (null: nobody
  // holds the result any more) takes them over, or they are given back.
  void AdoptNested(ObjectEntry* outer, const std::vector<std::string>& nested);

  // Borrower side: `n` registrations of `id` to give back to its owner.
  void QueueBorrowRelease(const std::string& id, int n);
  bool HasPendingReleases() const { return !pending_releases_.empty(); }
  Releases TakePendingReleases();
  // Queues the release of every registration this process holds (clean exit).
  void QueueAllBorrowReleases();

  // Lineage (owner): `task` made `id` and takes the owned objects `args` as arguments. False
  // (nothing kept) when `id` is unknown or the budget is spent. `bytes`: what the task costs.
  bool SetLineage(const std::string& id, std::shared_ptr<TaskRecord> task,
                  std::vector<std::string> args, size_t bytes);
  size_t lineage_bytes() const { return lineage_bytes_; }
  void set_lineage_budget(size_t bytes) { lineage_budget_ = bytes; }
  // An evicted entry's task runs again: it stops being evicted (its lineage stays).
  void Unevict(ObjectEntry& e) { e.evicted = false; }

  // Whether this process owns an object (something still refers to it, or it would be freed).
  bool OwnsLiveObjects() const;
  // Shutdown: forgets every entry; returns the keys of the segments to free in our node's store.
  std::vector<std::string> Clear();

 private:
  Hooks hooks_;
  std::string self_address_, node_id_, node_address_;
  Map objects_;
  std::unordered_map<std::string, BorrowerState> borrowers_;
  Releases pending_releases_;
  size_t lineage_bytes_ = 0;
  size_t lineage_budget_ = size_t{1} << 30;  // as Ray's max_lineage_bytes
  // Drops the lineage of an entry being freed: its arguments lose a lineage reference each.
  void ReleaseLineage(std::shared_ptr<ObjectEntry::Lineage> l);
  std::deque<std::shared_ptr<ObjectEntry::Lineage>> releasing_;  // ReleaseLineage's worklist
};

}  // namespace torus::core
