#include "head/placement_groups.h"

#include <algorithm>
#include <set>

#include "common/wall_clock.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/rpc.h"
#include "common/resources.h"
#include "tpu/gang_env.h"
#include "tpu/topology.h"

namespace torus {

namespace {

// A group's first grant: how long it waited (from its creation) and how long the head took to
// choose its nodes (docs/metrics.md).
void ObserveReservation(const rpc::PlacementGroupRecord& rec) {
  static auto& waited = prometheus::BuildHistogram()
                            .Name("torus_placement_group_reservation_seconds")
                            .Help("From a placement group's creation to its first grant, by kind (group, slice)")
                            .Register(ProcessMetrics());
  static auto& decided = prometheus::BuildHistogram()
                             .Name("torus_placement_decision_seconds")
                             .Help("Time the head took to choose the nodes of a grant, by kind (group, slice)")
                             .Register(ProcessMetrics());
  static auto* waited_group = &waited.Add({{"kind", "group"}}, LatencyBuckets());
  static auto* waited_slice = &waited.Add({{"kind", "slice"}}, LatencyBuckets());
  static auto* decided_group = &decided.Add({{"kind", "group"}}, LatencyBuckets());
  static auto* decided_slice = &decided.Add({{"kind", "slice"}}, LatencyBuckets());
  int64_t now_ms = WallClockMs();
  bool slice = rec.has_slice();
  (slice ? waited_slice : waited_group)->Observe(std::max<int64_t>(0, now_ms - rec.created_ms()) / 1000.0);
  (slice ? decided_slice : decided_group)->Observe(rec.decision_us() / 1e6);
}


bool SameSelector(const rpc::Bundle& a, const rpc::Bundle& b) {
  if (a.label_selector_size() != b.label_selector_size()) return false;
  for (int k = 0; k < b.label_selector_size(); ++k) {
    if (a.label_selector(k).key() != b.label_selector(k).key() ||
        a.label_selector(k).expr() != b.label_selector(k).expr()) {
      return false;
    }
  }
  return true;
}

// Checks bundle i of e->rec and appends its parsed selector to e->selectors.
Status ParseBundle(PgEntry* e, int i) {
  auto* b = e->rec.mutable_bundles(i);
  b->set_index(i);
  b->clear_node_id();
  b->clear_node_address();
  if (auto s = ValidateResourceSet(b->resources(), "bundle " + std::to_string(i)); !s.ok()) {
    return InvalidArgument(s.message());
  }
  bool any = false;
  for (const auto& [k, v] : FromProto(b->resources())) any = any || v.Positive();
  if (!any) return InvalidArgument("bundle " + std::to_string(i) + " is empty: give it at least one resource");
  // The bundles of a slice reservation all carry the same selector: parse it once.
  if (i > 0 && SameSelector(e->rec.bundles(i - 1), *b)) {
    e->selectors.push_back(e->selectors.back());
    return Status::Ok();
  }
  std::map<std::string, std::string> sel;
  for (const auto& t : b->label_selector()) sel[t.key()] = t.expr();
  auto terms = ParseLabelSelector(sel);
  if (!terms.ok()) return InvalidArgument("bundle " + std::to_string(i) + ": " + terms.status().message());
  e->selectors.push_back(*terms);
  return Status::Ok();
}

// Turns the slice request of e->rec into its shape (docs/tpu.md section 6).
Status ParseSliceRequest(PgEntry* e, PgEntry::Clock::time_point now) {
  const auto& sl = e->rec.slice();
  auto shape = tpu::ComputeSliceShape(sl.accelerator_version(), sl.topology(),
                                      sl.chips_per_vm() > 0 ? std::optional<int>(sl.chips_per_vm())
                                                            : std::nullopt);
  if (!shape.ok()) return InvalidArgument(shape.status().message());
  int bundles = e->rec.bundles_size(), num_slices = sl.num_slices();
  if (bundles % num_slices != 0) return InvalidArgument("slice bundles do not divide evenly");
  int timeout_ms = sl.timeout_ms();
  auto* out = e->rec.mutable_slice();
  out->set_pod_type(shape->pod_type);
  out->set_hosts_per_slice(shape->hosts);
  out->set_chips_per_host(shape->chips_per_host);
  out->set_bundles_per_slice(bundles / num_slices);
  out->set_bundles_per_host(std::max(1, out->bundles_per_slice() / shape->hosts));
  e->rec.clear_slice_names();
  for (int i = 0; i < num_slices; ++i) e->rec.add_slice_names("");
  if (timeout_ms >= 0) e->deadline = now + std::chrono::milliseconds(timeout_ms);
  return Status::Ok();
}

bool IsSliceReservation(const rpc::PlacementGroupRecord& rec) {
  return rec.has_slice() && rec.slice().num_slices() > 0;
}

}  // namespace

StatusOr<PgEntry> ParsePgRequest(const rpc::PlacementGroupRecord& req, PgEntry::Clock::time_point now) {
  PgStrategy strategy;
  if (!ParsePgStrategy(req.strategy(), &strategy)) {
    return InvalidArgument("unknown placement strategy '" + req.strategy() +
                           "' (expected PACK, SPREAD, STRICT_PACK or STRICT_SPREAD)");
  }
  if (req.bundles_size() == 0) return InvalidArgument("a placement group needs at least one bundle");
  PgEntry e;
  e.rec = req;
  for (int i = 0; i < req.bundles_size(); ++i) {
    if (auto s = ParseBundle(&e, i); !s.ok()) return s;
  }
  if (IsSliceReservation(req)) {
    if (auto s = ParseSliceRequest(&e, now); !s.ok()) return s;
  }
  if (!req.pg_id().empty() && !IsPgId(req.pg_id())) {
    return InvalidArgument("placement group id '" + req.pg_id() + "' is not 28 hex digits");
  }
  return e;
}

PlacementGroupManager::PlacementGroupManager(Mutex& mu, PgCluster& cluster, WorkQueue& pool,
                                             std::string token, std::chrono::milliseconds stray_grace)
    : mu_(mu), cluster_(cluster), pool_(pool), token_(std::move(token)), stray_grace_(stray_grace) {}

PlacementGroupManager::~PlacementGroupManager() { Stop(); }

void PlacementGroupManager::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void PlacementGroupManager::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    sched_cv_.NotifyAll();
    state_cv_.NotifyAll();
  }
  if (thread_.joinable()) thread_.join();
}

// ------------------------------------------------------------------------------- calls

grpc::Status PlacementGroupManager::Create(const rpc::PlacementGroupRecord& req,
                                           rpc::CreatePlacementGroupReply* reply) {
  auto parsed = ParsePgRequest(req, Clock::now());
  if (!parsed.ok()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, parsed.status().message());
    return grpc::Status::OK;
  }
  PgEntry& e = *parsed;
  std::string id = req.pg_id();  // minted by the caller: a repeated call finds its first group
  MutexLock lock(mu_);
  if (auto it = pgs_.find(id); it != pgs_.end()) {
    reply->set_pg_id(id);
    reply->set_state(it->second.rec.state());
    return grpc::Status::OK;
  }
  if (!req.name().empty()) {
    auto it = named_.find({req.ray_namespace(), req.name()});
    if (it != named_.end() && pgs_.count(it->second) &&
        pgs_[it->second].rec.state() != rpc::PlacementGroupRecord::REMOVED) {
      SetError(reply->mutable_error(), StatusCode::kAlreadyExists,
               "a placement group named '" + req.name() + "' already exists");
      return grpc::Status::OK;
    }
  }
  if (id.empty()) id = NewPgId();
  e.rec.set_pg_id(id);
  e.rec.set_state(rpc::PlacementGroupRecord::PENDING);
  e.rec.set_created_ms(WallClockMs());
  e.pending_since = Clock::now();
  TrimRemovedLocked();  // here: never while a caller iterates over pgs_
  if (!req.name().empty()) named_[{req.ray_namespace(), req.name()}] = id;
  pgs_[id] = std::move(e);
  queue_.push_back(id);
  reply->set_pg_id(id);
  if (!scheduling_ && queue_.size() == 1) {
    // Nothing is waiting ahead of it: place it on this thread now (the scheduler thread would
    // pick exactly this group), saving the caller a hand-off and a Wait round trip.
    ScheduleOnce();
  } else {
    sched_cv_.NotifyAll();
  }
  auto it = pgs_.find(id);
  // A group placed right here was saved CREATED by FinishGrant; a waiting one is saved now.
  if (it != pgs_.end() && it->second.rec.state() != rpc::PlacementGroupRecord::CREATED) SaveLocked(it->second);
  reply->set_state(it == pgs_.end() ? rpc::PlacementGroupRecord::REMOVED : it->second.rec.state());
  return grpc::Status::OK;
}

grpc::Status PlacementGroupManager::Remove(const rpc::PlacementGroupRequest& req) {
  std::vector<NodeCall> release;
  {
    MutexLock lock(mu_);
    auto it = pgs_.find(req.pg_id());
    if (it == pgs_.end()) return grpc::Status::OK;  // removed long ago, or a repeated call: Ray's too
    if (it->second.rec.state() == rpc::PlacementGroupRecord::REMOVED) return grpc::Status::OK;
    release = RemoveLocked(it->second, "removed by the user");
  }
  // Synchronously: when Remove returns, the resources are free (and our view says so).
  ReleaseOnNodes(release);
  return grpc::Status::OK;
}

grpc::Status PlacementGroupManager::Get(grpc::ServerContext* ctx, const rpc::PlacementGroupRequest& req,
                                        rpc::GetPlacementGroupReply* reply) {
  MutexLock lock(mu_);
  std::string id = req.pg_id();
  if (id.empty()) {
    auto it = named_.find({req.ray_namespace(), req.name()});
    if (it == named_.end()) return grpc::Status::OK;
    id = it->second;
  }
  auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, req.wait_created_ms()));
  while (true) {
    auto it = pgs_.find(id);
    if (it == pgs_.end()) return grpc::Status::OK;
    const auto st = it->second.rec.state();
    if (st == rpc::PlacementGroupRecord::CREATED || st == rpc::PlacementGroupRecord::REMOVED ||
        Clock::now() >= deadline || stopping_ || ctx->IsCancelled()) {
      reply->set_found(true);
      *reply->mutable_pg() = it->second.rec;
      return grpc::Status::OK;
    }
    // Timed: a cancelled caller is noticed within 200 ms.
    state_cv_.WaitUntil(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
  }
}

// ------------------------------------------------------------------------------- the head's view

const rpc::PlacementGroupRecord* PlacementGroupManager::Find(const std::string& pg_id) const {
  auto it = pgs_.find(pg_id);
  return it == pgs_.end() ? nullptr : &it->second.rec;
}

std::string PlacementGroupManager::HolderOf(const std::string& slice) const {
  auto it = slice_holder_.find(slice);
  return it == slice_holder_.end() ? std::string() : it->second;
}

void PlacementGroupManager::AppendTo(rpc::ListReply* reply) const {
  for (const auto& [id, e] : pgs_) *reply->add_placement_groups() = e.rec;
}

void PlacementGroupManager::RemoveJobGroups(const std::string& job_id) {
  std::vector<NodeCall> release;
  for (auto& [id, e] : pgs_) {
    if (e.rec.job_id() != job_id || e.rec.detached() || e.rec.state() == rpc::PlacementGroupRecord::REMOVED) {
      continue;
    }
    for (auto& r : RemoveLocked(e, "the job that created it finished")) release.push_back(std::move(r));
  }
  if (!release.empty()) ReleaseInBackground(std::move(release));
}

void PlacementGroupManager::OnNodeLost(const std::string& node_id) {
  LoseBundlesLocked(node_id, [](const PgEntry&, int) { return true; });
  for (auto it = strays_.begin(); it != strays_.end();) {  // gone with the node
    it = std::get<0>(it->first) == node_id ? strays_.erase(it) : std::next(it);
  }
}

void PlacementGroupManager::LoseBundlesLocked(const std::string& node_id, const LostBundle& lost) {
  std::vector<NodeCall> release;
  for (auto& [id, e] : pgs_) {
    if (e.rec.state() != rpc::PlacementGroupRecord::CREATED &&
        e.rec.state() != rpc::PlacementGroupRecord::RESCHEDULING) {
      continue;
    }
    if (IsSliceReservation(e.rec)) {
      OnSliceNodeLost(e, node_id, lost, &release);
      continue;
    }
    bool hit = false;
    for (auto& b : *e.rec.mutable_bundles()) {
      if (b.node_id() == node_id && lost(e, b.index())) {
        b.clear_node_id();
        b.clear_node_address();
        hit = true;
      }
    }
    if (!hit) continue;
    TORUS_LOG(WARNING) << "placement group " << id << " lost bundles on node " << node_id << ": RESCHEDULING";
    Reschedule(e);
    SaveLocked(e);  // also when it was RESCHEDULING already
  }
  if (!release.empty()) ReleaseInBackground(std::move(release));
  sched_cv_.NotifyAll();
}

void PlacementGroupManager::OnSliceNodeLost(PgEntry& e, const std::string& node_id, const LostBundle& gone,
                                            std::vector<NodeCall>* release) {
  // A slice is granted, lost and re-granted whole (docs/tpu.md section 6 "Failure").
  const std::string& id = e.rec.pg_id();
  int per = e.rec.slice().bundles_per_slice();
  std::set<int> lost;
  for (const auto& b : e.rec.bundles()) {
    if (b.node_id() == node_id && gone(e, b.index())) lost.insert(b.index() / per);
  }
  if (lost.empty()) return;
  e.rec.set_epoch(e.rec.epoch() + 1);
  std::map<std::pair<std::string, std::string>, rpc::BundlesRequest> by_node;  // (address, id)
  for (int si : lost) {
    std::string slice = e.rec.slice_names(si);
    std::string reason = "SliceLost: slice '" + slice + "' (slice index " + std::to_string(si) +
                         ") of reservation " + id + " lost node " + node_id + "; epoch " +
                         std::to_string(e.rec.epoch());
    TORUS_LOG(WARNING) << reason;
    for (auto& b : *e.rec.mutable_bundles()) {
      if (b.index() / per != si) continue;
      if (!b.node_address().empty() && b.node_id() != node_id) {
        auto& r = by_node[{b.node_address(), b.node_id()}];
        r.set_pg_id(id);
        r.set_reason(reason);
        r.add_bundles()->set_index(b.index());
      }
      b.clear_node_id();
      b.clear_node_address();
    }
    auto h = slice_holder_.find(slice);
    if (h != slice_holder_.end() && h->second == id) slice_holder_.erase(h);
    e.rec.set_slice_names(si, "");
  }
  for (auto& [node, r] : by_node) release->push_back({node.second, node.first, r.SerializeAsString()});
  // Every task and actor of a slice reservation fails: the program cannot go on without the
  // lost slice. Actors in it die (restartable ones come back after the re-grant).
  cluster_.OnPgSliceLost(id);
  Reschedule(e);
  SaveLocked(e);  // also when it was RESCHEDULING already
}

void PlacementGroupManager::Reschedule(PgEntry& e) {
  if (e.rec.state() != rpc::PlacementGroupRecord::CREATED) return;
  e.rec.set_state(rpc::PlacementGroupRecord::RESCHEDULING);
  e.pending_since = Clock::now();
  e.tried_view = 0;
  queue_.push_front(e.rec.pg_id());  // repairs go first
  SaveLocked(e);
}

// ------------------------------------------------------------------------------- removal

std::vector<NodeCall> PlacementGroupManager::RemoveLocked(PgEntry& e, const std::string& why) {
  std::vector<NodeCall> out;
  e.rec.set_state(rpc::PlacementGroupRecord::REMOVED);
  removed_.push_back(e.rec.pg_id());
  e.rec.set_pending_reason(why);
  SaveLocked(e);
  for (const auto& name : e.rec.slice_names()) {
    auto h = slice_holder_.find(name);
    if (h != slice_holder_.end() && h->second == e.rec.pg_id()) slice_holder_.erase(h);
  }
  // A group being reserved right now is released by the scheduler when it sees REMOVED.
  if (!e.scheduling) {
    std::map<std::pair<std::string_view, std::string_view>, std::vector<int>> by_node;  // (address, id) -> indexes
    for (const auto& b : e.rec.bundles()) {
      if (!b.node_address().empty()) by_node[{b.node_address(), b.node_id()}].push_back(b.index());
    }
    out.reserve(by_node.size());
    for (const auto& [node, indexes] : by_node) {
      out.push_back({std::string(node.second), std::string(node.first), ReleasePayload(e.rec.pg_id(), indexes, "")});
    }
  }
  cluster_.OnPgRemoved(e.rec.pg_id(), why);
  state_cv_.NotifyAll();
  return out;
}

void PlacementGroupManager::ReleaseOnNodes(const std::vector<NodeCall>& what) {
  if (what.empty()) return;
  auto results = CallNodes(token_, BundleOp::kRelease, what);
  MutexLock lock(mu_);
  for (size_t i = 0; i < what.size(); ++i) {
    if (!results[i].status.ok()) {
      TORUS_LOG(WARNING) << "cannot release bundles on " << what[i].address << ": "
                         << results[i].status.error_message();
      continue;
    }
    cluster_.ApplyLedger(what[i], results[i]);
  }
  sched_cv_.NotifyAll();
}

void PlacementGroupManager::ReleaseInBackground(std::vector<NodeCall> what) {
  // Dropped only when the head is stopping: the nodes then free the bundles of a gone head.
  (void)pool_.Post([this, what = std::move(what)] { ReleaseOnNodes(what); });
}

void PlacementGroupManager::TrimRemovedLocked() {
  while (removed_.size() > kKeepRemovedPgs) {
    auto it = pgs_.find(removed_.front());
    if (it != pgs_.end()) {
      if (it->second.scheduling) break;  // its reservation is still being wound down: later
      if (it->second.rec.state() == rpc::PlacementGroupRecord::REMOVED) {
        const auto& rec = it->second.rec;
        auto n = named_.find({rec.ray_namespace(), rec.name()});
        if (n != named_.end() && n->second == rec.pg_id()) named_.erase(n);
        pgs_.erase(it);
      }
    }
    removed_.pop_front();
  }
}

// ------------------------------------------------------------------------------- scheduling

void PlacementGroupManager::Loop() {
  MutexLock lock(mu_);
  while (!stopping_) {
    // Timed: a group's deadline and retry time pass without any event.
    if (scheduling_ || !ScheduleOnce()) sched_cv_.WaitFor(lock, std::chrono::milliseconds(100));
  }
}

bool PlacementGroupManager::ScheduleOnce() {
  std::vector<std::string> placed_ids;  // node id per bundle
  PgEntry* e = ChooseNext(&placed_ids);
  if (!e) return false;
  scheduling_ = true;
  e->scheduling = true;
  Grant g = BeginGrant(*e, placed_ids);
  mu_.Unlock();
  std::vector<BundleReply> results;
  std::vector<size_t> answered;  // calls whose node answered (its ledger is in results)
  std::string failure = ReserveOnNodes(g, &results, &answered);
  mu_.Lock();
  scheduling_ = false;
  for (size_t i : answered) cluster_.ApplyLedger(g.calls[i], results[i]);
  FinishGrant(g, failure);
  return true;
}

PgEntry* PlacementGroupManager::ChooseNext(std::vector<std::string>* placed_ids) {
  for (auto it = queue_.begin(); it != queue_.end();) {
    auto pit = pgs_.find(*it);
    if (pit == pgs_.end() || (pit->second.rec.state() != rpc::PlacementGroupRecord::PENDING &&
                              pit->second.rec.state() != rpc::PlacementGroupRecord::RESCHEDULING)) {
      it = queue_.erase(it);
      continue;
    }
    PgEntry& e = pit->second;
    if (e.rec.state() == rpc::PlacementGroupRecord::PENDING && Clock::now() >= e.deadline) {
      std::string why = "DeadlineExceeded: not granted within the timeout (" + e.rec.pending_reason() + ")";
      TORUS_LOG(INFO) << "reservation " << e.rec.pg_id() << ": " << why;
      RemoveLocked(e, why);  // a pending group holds nothing: no bundles to release
      it = queue_.erase(it);
      continue;
    }
    switch (TryPlace(e, placed_ids)) {
      case Try::kPlaced: return &e;
      case Try::kBlock: return nullptr;
      case Try::kSkip: ++it; break;
    }
  }
  return nullptr;
}

PlacementGroupManager::Try PlacementGroupManager::TryPlace(PgEntry& e, std::vector<std::string>* placed_ids) {
  bool aged = Clock::now() - e.pending_since > kAging;
  // Tried on this very view and failed: wait for the view to change, or for the retry time
  // after a failed call to a node (the view may never change on an idle cluster).
  if (e.tried_view == cluster_.ViewVersion() && Clock::now() < e.retry_at) {
    return aged && e.feasible ? Try::kBlock : Try::kSkip;
  }
  auto decide_start = Clock::now();
  Try t = IsSliceReservation(e.rec) ? TryPlaceSlices(e, placed_ids) : TryPlaceBundles(e, aged, placed_ids);
  if (t == Try::kPlaced) {
    e.rec.set_decision_us(std::chrono::duration<double, std::micro>(Clock::now() - decide_start).count());
  }
  return t;
}

PlacementGroupManager::Try PlacementGroupManager::TryPlaceSlices(PgEntry& e, std::vector<std::string>* placed_ids) {
  // Whole idle slices from the live slice index: no scan of the node table.
  std::string reason;
  std::vector<std::string> names;
  auto placed = PlaceSlices(e, &names, &reason);
  if (!placed) {
    e.tried_view = cluster_.ViewVersion();
    e.retry_at = Clock::time_point::max();
    e.feasible = false;  // slices never block other requests (spec: no anti-starvation)
    e.rec.set_pending_reason(reason);
    return Try::kSkip;
  }
  for (int i = 0; i < static_cast<int>(names.size()); ++i) {
    if (e.rec.slice_names(i).empty()) slice_holder_[names[i]] = e.rec.pg_id();
    e.rec.set_slice_names(i, names[i]);
  }
  *placed_ids = std::move(*placed);
  return Try::kPlaced;
}

PlacementGroupManager::Try PlacementGroupManager::TryPlaceBundles(PgEntry& e, bool aged,
                                                                 std::vector<std::string>* placed_ids) {
  // From the live placement index: no copy of the node table.
  const PlacementIndex& index = cluster_.Placement();
  std::vector<BundleDemand> demands;
  for (int i = 0; i < e.rec.bundles_size(); ++i) {
    const auto& b = e.rec.bundles(i);
    BundleDemand d{FromProto(b.resources()), e.selectors[i], -1};
    uint32_t slot = b.node_id().empty() ? PlacementIndex::kNoSlot : index.SlotOf(b.node_id());
    if (slot != PlacementIndex::kNoSlot) d.fixed_node = static_cast<int>(slot);
    demands.push_back(std::move(d));
  }
  PgStrategy strategy;
  ParsePgStrategy(e.rec.strategy(), &strategy);
  auto placed = PlaceBundles(demands, index, strategy);
  // What fits the nodes' available resources fits their totals: plan against the totals ("could
  // this ever be placed?") only when the group must wait.
  e.feasible = placed.has_value() || PlaceBundles(demands, index, strategy, /*use_total=*/true).has_value();
  if (!placed) {
    e.tried_view = cluster_.ViewVersion();
    e.retry_at = Clock::time_point::max();
    std::string reason = e.feasible ? "waiting for resources" : "infeasible: no set of nodes can hold these bundles";
    if (reason != e.rec.pending_reason()) TORUS_LOG(INFO) << "placement group " << e.rec.pg_id() << " " << reason;
    e.rec.set_pending_reason(reason);
    return aged && e.feasible ? Try::kBlock : Try::kSkip;
  }
  for (int slot : *placed) placed_ids->push_back(slot >= 0 ? index.Id(static_cast<uint32_t>(slot)) : std::string());
  return Try::kPlaced;
}

std::optional<std::vector<std::string>> PlacementGroupManager::PlaceSlices(PgEntry& e,
                                                                           std::vector<std::string>* slice_names,
                                                                           std::string* reason) {
  const auto& sl = e.rec.slice();
  const std::string& pod = sl.pod_type();
  int per = sl.bundles_per_slice(), b_per_host = std::max(1, sl.bundles_per_host());
  std::vector<std::string> out(e.rec.bundles_size());
  *slice_names = std::vector<std::string>(e.rec.slice_names().begin(), e.rec.slice_names().end());
  std::set<std::string> used(slice_names->begin(), slice_names->end());
  const SliceIndex& index = cluster_.Slices();
  const auto* holders = &slice_holder_;  // read in the lambda below, under mu_
  for (int si = 0; si < sl.num_slices(); ++si) {
    if (!(*slice_names)[si].empty()) {
      for (int k = 0; k < per; ++k) out[si * per + k] = e.rec.bundles(si * per + k).node_id();
      continue;
    }
    // The user may pin slice index si to a named slice.
    std::string wanted;
    for (int k = 0; k < per; ++k) {
      for (const auto& t : e.selectors[si * per + k]) {
        if (t.key == tpu::kLabelSliceName && t.op == LabelCondition::Op::kEq) wanted = t.values[0];
      }
    }
    const SliceIndex::Slice* pick = index.FirstIdle(pod, wanted, [&](const SliceIndex::Slice& s) {
      if (holders->count(s.name) || used.count(s.name)) return false;
      if (static_cast<int>(s.hosts.size()) * b_per_host < per) return false;
      if (sl.chips_per_vm() > 0) {
        for (int c : s.chips) {
          if (c != sl.chips_per_vm()) return false;
        }
      }
      for (int k = 0; k < per; ++k) {
        const auto& selector = e.selectors[si * per + k];
        // Read in place: a map of the node's labels per bundle cost ~5% of the head's CPU per
        // 64-host reservation.
        if (!selector.empty() && !cluster_.NodeMatches(selector, std::string(s.hosts[k / b_per_host]))) return false;
      }
      return true;
    });
    if (!pick) {
      int ready = 0;
      for (const auto& name : index.Idle(pod)) ready += !slice_holder_.count(name);
      int intact = index.NumIntact(pod);
      *reason = "waiting for " + std::to_string(sl.num_slices()) + " idle " + pod + " slice(s) (" +
                sl.topology() + "): " + std::to_string(intact) + " intact, " + std::to_string(ready) + " ready";
      if (intact == 0) *reason += "; no such slice is in the cluster: it waits until one joins";
      return std::nullopt;
    }
    for (int k = 0; k < per; ++k) out[si * per + k] = std::string(pick->hosts[k / b_per_host]);
    (*slice_names)[si] = pick->name;
    used.insert(pick->name);
  }
  return out;
}

void PlacementGroupManager::SetSliceEnv(PgEntry& e, const std::vector<std::string>& placed_ids) {
  // docs/tpu.md section 7 "Multislice": every process in a bundle of a multislice reservation
  // gets MEGASCALE_* naming host 0 of slice 0 of this grant; a single-slice one gets none.
  const auto& sl = e.rec.slice();
  int per = std::max(1, sl.bundles_per_slice());
  std::string host;
  if (sl.num_slices() > 1 && !placed_ids.empty()) {
    std::string addr = cluster_.NodeAddress(placed_ids[0]);
    host = addr.substr(0, addr.rfind(':'));
  }
  auto pod = tpu::ParsePodType(sl.pod_type());
  tpu::Generation gen = pod.ok() ? pod->gen : tpu::Generation::kV6e;
  for (int i = 0; i < e.rec.bundles_size(); ++i) {
    auto* b = e.rec.mutable_bundles(i);
    b->clear_env();
    b->clear_env_unset();
    tpu::EnvChanges c = tpu::MegascaleEnv(gen, host, sl.num_slices(), i / per);
    for (const auto& [k, v] : c.set) (*b->mutable_env())[k] = v;
    for (const auto& k : c.unset) b->add_env_unset(k);
  }
}

PlacementGroupManager::Grant PlacementGroupManager::BeginGrant(PgEntry& e,
                                                              const std::vector<std::string>& placed_ids) {
  Grant g;
  g.pg_id = e.rec.pg_id();
  if (IsSliceReservation(e.rec)) SetSliceEnv(e, placed_ids);
  for (int i = 0; i < e.rec.bundles_size(); ++i) {
    if (!e.rec.bundles(i).node_id().empty()) continue;
    std::string addr = cluster_.NodeAddress(placed_ids[i]);
    g.by_node[addr].push_back(i);
    g.node_of_addr[addr] = placed_ids[i];
  }
  // Each node's request is serialised straight from the record, here under mu: the record is
  // not to be read while another thread changes it.
  g.calls.reserve(g.by_node.size());
  for (const auto& [addr, which] : g.by_node) g.calls.push_back({g.node_of_addr.at(addr), addr, BundlesPayload(e.rec, which)});
  if (store_) {
    for (const auto& [addr, which] : g.by_node) {
      auto* intent = e.rec.add_granting();
      intent->set_node_address(addr);
      for (int i : which) intent->add_indexes(i);
    }
    SaveLocked(e);
    e.rec.clear_granting();  // in memory only the store needs it
  }
  return g;
}

std::string PlacementGroupManager::ReserveOnNodes(const Grant& g, std::vector<BundleReply>* results,
                                                  std::vector<size_t>* answered) {
  // Each node reserves and commits in one step (head/bundle_calls.h): the head's CREATED is
  // the group's commit point.
  std::vector<size_t> prepared;  // calls whose node reserved its bundles
  std::string failure;
  *results = CallNodes(token_, BundleOp::kPrepare, g.calls);
  for (size_t i = 0; i < g.calls.size(); ++i) {
    const auto& r = (*results)[i];
    if (r.status.ok()) answered->push_back(i);
    if (r.status.ok() && r.ok) prepared.push_back(i);
    if ((r.status.ok() && r.ok) || !failure.empty()) continue;
    failure = r.status.ok() ? r.error : "prepare on " + g.calls[i].address + " failed: " + r.status.error_message();
  }
  if (failure.empty()) return failure;
  // Roll back every reserved bundle: a group never holds part of its bundles.
  std::vector<NodeCall> undo;
  for (size_t i : prepared) undo.push_back({g.calls[i].node_id, g.calls[i].address, ReleasePayload(g.pg_id, g.by_node.at(g.calls[i].address), "")});
  ReleaseOnNodes(undo);
  return failure;
}

void PlacementGroupManager::FinishGrant(const Grant& g, const std::string& failure) {
  auto pit = pgs_.find(g.pg_id);
  if (pit == pgs_.end()) return;
  PgEntry& done = pit->second;
  done.scheduling = false;
  if (done.rec.state() == rpc::PlacementGroupRecord::REMOVED) {
    // Removed while being reserved: undo what the nodes reserved.
    mu_.Unlock();
    if (failure.empty()) {
      std::vector<NodeCall> undo;
      for (const auto& [addr, which] : g.by_node) undo.push_back({g.node_of_addr.at(addr), addr, ReleasePayload(g.pg_id, which, "")});
      ReleaseOnNodes(undo);
    }
    mu_.Lock();
    return;
  }
  if (!failure.empty()) {
    GrantFailed(done, failure);
    return;
  }
  for (const auto& [addr, which] : g.by_node) {
    const std::string& node_id = g.node_of_addr.at(addr);
    for (int i : which) {
      auto* rb = done.rec.mutable_bundles(i);
      rb->set_node_id(node_id);
      rb->set_node_address(addr);
    }
  }
  if (done.rec.state() == rpc::PlacementGroupRecord::PENDING) ObserveReservation(done.rec);
  done.rec.set_state(rpc::PlacementGroupRecord::CREATED);
  done.rec.clear_pending_reason();
  SaveLocked(done);
  cluster_.OnPgCreated();
  state_cv_.NotifyAll();
  sched_cv_.NotifyAll();
}

void PlacementGroupManager::DropUngrantedSlicesLocked(PgEntry& e) {
  if (!e.rec.has_slice()) return;
  // Give back the slices chosen for an attempt that did not finish (slice indices with no
  // bundle placed).
  int per = std::max(1, e.rec.slice().bundles_per_slice());
  for (int i = 0; i < e.rec.slice_names_size(); ++i) {
    bool placed_here = false;
    for (const auto& b : e.rec.bundles()) placed_here = placed_here || (b.index() / per == i && !b.node_id().empty());
    if (placed_here) continue;
    auto h = slice_holder_.find(e.rec.slice_names(i));
    if (h != slice_holder_.end() && h->second == e.rec.pg_id()) slice_holder_.erase(h);
    e.rec.set_slice_names(i, "");
  }
}

void PlacementGroupManager::GrantFailed(PgEntry& e, const std::string& failure) {
  DropUngrantedSlicesLocked(e);
  TORUS_LOG(INFO) << "placement group " << e.rec.pg_id() << " not placed yet: " << failure;
  e.tried_view = cluster_.ViewVersion();
  e.retry_at = Clock::now() + std::chrono::milliseconds(200);
  e.rec.set_pending_reason("waiting for resources (" + failure + ")");
  SaveLocked(e);  // without the grant's intent: the nodes rolled back
  sched_cv_.NotifyAll();
}

}  // namespace torus
