#include "head/head.h"

#include <algorithm>
#include <set>

#include "common/ids.h"
#include "common/lane.h"
#include "common/logging.h"
#include "head/placement.h"
#include "head/slice_idle.h"
#include "head/slices.h"
#include "tpu/gang_env.h"
#include "tpu/topology.h"
#include "common/rpc.h"
#include "common/session.h"

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;

void SetError(rpc::Error* e, StatusCode code, const std::string& msg) {
  e->set_code(static_cast<int>(code));
  e->set_message(msg);
}

// What a node registers must hold to the rules `torus start` applies, so that a hand-made
// RegisterNode cannot inject negative or absurd capacities.
Status ValidateNodeRecord(const rpc::NodeRecord& n) {
  if (auto s = ValidateResources(FromProto(n.total()), "node " + n.node_id() + " resources"); !s.ok()) {
    return s;
  }
  std::map<std::string, std::string> labels(n.labels().begin(), n.labels().end());
  return ValidateRegisteredLabels(labels, n.node_id(), n.hostname());
}

using wire::PutBytes;
using wire::PutTag;
using wire::PutVarint;

// A serialised rpc::BundlesRequest for `pg_id` with the bundles `which` of `rec`, each exactly
// as in the record (resources, label selector, environment), and `commit`.
std::string BundlesPayload(const rpc::PlacementGroupRecord& rec, const std::vector<int>& which, bool commit) {
  std::string out;
  PutBytes(&out, rpc::BundlesRequest::kPgIdFieldNumber, rec.pg_id());
  for (int i : which) {
    const rpc::Bundle& b = rec.bundles(i);
    PutTag(&out, rpc::BundlesRequest::kBundlesFieldNumber, 2);
    PutVarint(&out, b.ByteSizeLong());
    b.AppendPartialToString(&out);
  }
  if (commit) {
    PutTag(&out, rpc::BundlesRequest::kCommitFieldNumber, 0);
    PutVarint(&out, 1);
  }
  return out;
}

// A serialised rpc::BundlesRequest releasing bundles by index (a release needs nothing else).
std::string ReleasePayload(const std::string& pg_id, const std::vector<int>& indexes, const std::string& reason) {
  std::string out;
  PutBytes(&out, rpc::BundlesRequest::kPgIdFieldNumber, pg_id);
  for (int index : indexes) {
    std::string b;
    if (index != 0) {
      PutTag(&b, rpc::Bundle::kIndexFieldNumber, 0);
      PutVarint(&b, static_cast<uint64_t>(static_cast<int64_t>(index)));
    }
    PutBytes(&out, rpc::BundlesRequest::kBundlesFieldNumber, b);
  }
  if (!reason.empty()) PutBytes(&out, rpc::BundlesRequest::kReasonFieldNumber, reason);
  return out;
}

// Protobuf wire-format reading for the bundle replies.
bool ReadVarint(const char*& p, const char* end, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    uint8_t b = static_cast<uint8_t>(*p++);
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}
// A length-delimited field's bytes [*begin, *begin + *size) in [p, end); moves p past them.
bool ReadLength(const char*& p, const char* end, const char** begin, size_t* size) {
  uint64_t n;
  if (!ReadVarint(p, end, &n) || n > static_cast<uint64_t>(end - p)) return false;
  *begin = p;
  *size = static_cast<size_t>(n);
  p += n;
  return true;
}
// Skips a field of wire type `wt` (not a group).
bool SkipField(const char*& p, const char* end, int wt) {
  uint64_t v;
  const char* b;
  size_t n;
  switch (wt) {
    case 0: return ReadVarint(p, end, &v);
    case 1: if (end - p < 8) return false; p += 8; return true;
    case 2: return ReadLength(p, end, &b, &n);
    case 5: if (end - p < 4) return false; p += 4; return true;
    default: return false;
  }
}
}  // namespace

bool Head::ParseBundleReply(BundleReply* r) {
  using R = rpc::PrepareBundlesReply;
  const char* base = r->raw.data();
  const char* p = base;
  const char* end = base + r->raw.size();
  while (p < end) {
    uint64_t tag;
    if (!ReadVarint(p, end, &tag)) return false;
    int field = static_cast<int>(tag >> 3), wt = static_cast<int>(tag & 7);
    uint64_t v;
    const char* b;
    size_t n;
    if (field == R::kOkFieldNumber && wt == 0) {
      if (!ReadVarint(p, end, &v)) return false;
      r->ok = v != 0;
    } else if (field == R::kErrorFieldNumber && wt == 2) {
      if (!ReadLength(p, end, &b, &n)) return false;
      r->error.assign(b, n);
    } else if (field == R::kLedgerSeqFieldNumber && wt == 0) {
      if (!ReadVarint(p, end, &r->ledger_seq)) return false;
    } else if (field == R::kAvailableFieldNumber && wt == 2) {
      if (!ReadLength(p, end, &b, &n)) return false;
      const char* q = b;
      const char* qend = b + n;
      while (q < qend) {  // rpc::ResourceSet
        if (!ReadVarint(q, qend, &tag)) return false;
        if (static_cast<int>(tag >> 3) != rpc::ResourceSet::kAmountsFieldNumber || (tag & 7) != 2) {
          if (!SkipField(q, qend, static_cast<int>(tag & 7))) return false;
          continue;
        }
        const char* e;
        size_t en;
        if (!ReadLength(q, qend, &e, &en)) return false;
        Head::BundleReply::Amount a;
        const char* x = e;
        const char* xend = e + en;
        while (x < xend) {  // one map entry: key = name, value = amount
          if (!ReadVarint(x, xend, &tag)) return false;
          int f = static_cast<int>(tag >> 3), t = static_cast<int>(tag & 7);
          if (f == wire::kMapKeyField && t == 2) {
            const char* kb;
            size_t kn;
            if (!ReadLength(x, xend, &kb, &kn)) return false;
            a.name_offset = static_cast<uint32_t>(kb - base);
            a.name_size = static_cast<uint32_t>(kn);
          } else if (f == wire::kMapValueField && t == 1) {
            if (xend - x < 8) return false;
            memcpy(&a.value, x, 8);
            x += 8;
          } else if (!SkipField(x, xend, t)) {
            return false;
          }
        }
        r->available.push_back(a);
      }
    } else if (!SkipField(p, end, wt)) {
      return false;
    }
  }
  return true;
}


Head::Head(HeadConfig cfg) : cfg_(std::move(cfg)) {}

Head::~Head() { Stop(); }

Status Head::Start() {
  if (auto s = ValidateToken(cfg_.token, "the head's configuration"); !s.ok()) return s;
  int port = cfg_.port;
  job_manager_ = std::make_unique<JobManager>(JobManagerConfig{cfg_.token, cfg_.session_dir});
  lane_ = std::make_unique<LaneServer>(cfg_.token, "head");
  lane_->Handle("/torus.rpc.Head/CreatePlacementGroup", this, &rpc::Head::Service::CreatePlacementGroup);
  lane_->Handle("/torus.rpc.Head/RemovePlacementGroup", this, &rpc::Head::Service::RemovePlacementGroup);
  lane_->Handle("/torus.rpc.Head/GetPlacementGroup", this, &rpc::Head::Service::GetPlacementGroup);
  lane_->Handle("/torus.rpc.Head/Heartbeat", this, &rpc::Head::Service::Heartbeat);
  if (lane_->Start(cfg_.bind_host) == 0) {
    TORUS_LOG(WARNING) << "head: no lane port on " << cfg_.bind_host << "; placement-group calls use gRPC";
  }
  std::string why;
  server_ = StartServer(cfg_.bind_host, &port, {this, job_manager_.get(), lane_.get()}, 0, &why);
  if (!server_ || port == 0) {
    lane_->Stop();
    return Unavailable("head cannot listen on " + cfg_.bind_host + ":" + std::to_string(cfg_.port) + ": " + why);
  }
  address_ = cfg_.bind_host + ":" + std::to_string(port);
  RegisterInProcessServer(address_, server_.get(), this);
  job_manager_->SetHeadAddress(address_);
  TORUS_LOG(INFO) << "head listening on " << address_ << ", session " << cfg_.session_dir;
  monitor_thread_ = std::thread([this] { MonitorLoop(); });
  pg_thread_ = std::thread([this] { PgLoop(); });
  return Status::Ok();
}

void Head::Wait() {
  std::unique_lock<std::mutex> lock(stop_mu_);
  stopped_cv_.wait(lock, [this] { return stopped_; });
}

void Head::Stop() {
  if (stopping_.exchange(true)) {
    Wait();
    return;
  }
  if (job_manager_) job_manager_->Stop();  // first: it still talks to our own service
  {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
    pg_cv_.notify_all();
  }
  if (monitor_thread_.joinable()) monitor_thread_.join();
  if (pg_thread_.joinable()) pg_thread_.join();
  UnregisterInProcessServer(address_);
  if (lane_) lane_->Stop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  std::lock_guard<std::mutex> lock(stop_mu_);
  stopped_ = true;
  stopped_cv_.notify_all();
}

// ------------------------------------------------------------------------------- nodes

grpc::Status Head::RegisterNode(grpc::ServerContext* ctx, const rpc::RegisterNodeRequest* req,
                                rpc::RegisterNodeReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  const auto& n = req->node();
  if (n.node_id().empty() || n.address().empty()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument,
             "node registration needs a node id and an address");
    return grpc::Status::OK;
  }
  if (auto s = ValidateNodeRecord(n); !s.ok()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, s.message());
    return grpc::Status::OK;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = nodes_.try_emplace(n.node_id());
  const std::string* id = &it->first;
  auto& e = it->second;
  if (!fresh) {
    auto old = node_by_address_.find(e.address);
    if (old != node_by_address_.end() && old->second == id) node_by_address_.erase(old);
  }
  SetFromRecord(names_, n, &e);
  e.known = true;
  e.ledger_seq = 0;
  e.pending.clear();
  node_by_address_.erase(std::string_view(e.address));
  node_by_address_.emplace(std::string_view(e.address), id);
  if (!e.alive) ++alive_nodes_;
  e.alive = true;
  e.start_time_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  e.last_heartbeat = Clock::now();
  IndexNodeLocked(*id, e);
  BumpView(id);
  NoteLane(n.address(), static_cast<int>(req->lane_port()), req->lane_unix());
  reply->set_session_dir(cfg_.session_dir);
  e.beat_ms = PacedHeartbeatMsLocked();
  reply->set_heartbeat_ms(e.beat_ms);
  TORUS_LOG(INFO) << (fresh ? "node registered: " : "node re-registered: ") << n.node_id() << " at "
                  << n.address() << " " << ResourcesToString(FromProto(n.total()));
  SchedulePendingActors();
  return grpc::Status::OK;
}

grpc::Status Head::UnregisterNode(grpc::ServerContext* ctx, const rpc::UnregisterNodeRequest* req,
                                  rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(req->node_id());
  if (it == nodes_.end()) return grpc::Status::OK;
  if (it->second.alive) --alive_nodes_;
  it->second.alive = false;
  IndexNodeLocked(it->first, it->second);
  BumpView(&it->first);
  TORUS_LOG(INFO) << "node left: " << req->node_id();
  OnNodeLostForPgs(req->node_id());
  for (auto& [id, a] : actors_) {
    if (a.rec.node_id() == req->node_id() &&
        (a.rec.state() == "ALIVE" || a.rec.state() == "PENDING")) {
      OnActorWorkerGone(a, "its node " + req->node_id() + " stopped", false);
    }
  }
  return grpc::Status::OK;
}

grpc::Status Head::Heartbeat(grpc::ServerContext* ctx, const rpc::HeartbeatRequest* req,
                             rpc::HeartbeatReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(req->node_id());
  if (it == nodes_.end() || !it->second.alive) {
    reply->set_unknown_node(true);
    return grpc::Status::OK;
  }
  auto& e = it->second;
  e.last_heartbeat = Clock::now();
  uint32_t paced = PacedHeartbeatMsLocked();
  reply->set_heartbeat_ms(paced);
  e.beat_ms = std::max(paced, req->heartbeat_ms());
  e.reported_beat_ms = req->heartbeat_ms();
  // A heartbeat older than a bundle reply we already applied would undo that reply.
  bool changed = req->ledger_seq() >= e.ledger_seq && !SameResources(names_, e.Available(), req->available());
  if (changed) {
    SetAvailable(names_, req->available(), &e);
    e.ledger_seq = req->ledger_seq();
    IndexNodeLocked(it->first, e);
    BumpView(&it->first);
  }
  if (req->pending_size() > 0 || !e.pending.empty()) {
    e.pending.assign(req->pending().begin(), req->pending().end());
  }
  if (req->want_view() || alive_nodes_ <= static_cast<size_t>(cfg_.push_view_max_nodes)) {
    FillViewLocked(req->view_version(), reply);
  } else {
    reply->set_view_version(req->view_version());  // nothing shipped: the node keeps its view
  }
  if (changed) {
    SchedulePendingActors();
    pg_cv_.notify_all();
  }
  return grpc::Status::OK;
}

void Head::BumpView(const std::string* node) {
  ++view_version_;
  view_log_.emplace_back(view_version_, node);
  // Deltas are given only to nodes at most max(64, N/2) versions behind (FillViewLocked): the
  // log keeps that many (at least 4096); a node further behind gets the whole view.
  size_t cap = std::max<size_t>(4096, nodes_.size() / 2 + 1);
  while (view_log_.size() > cap) {
    view_log_floor_ = view_log_.front().first;
    view_log_.pop_front();
  }
}

void Head::FillViewLocked(uint64_t version, rpc::HeartbeatReply* reply) {
  reply->set_view_version(view_version_);
  if (version == view_version_) return;
  // One budget of view records per second (--view-records-per-s) paces all view shipping
  // except small deltas, so that thousands of nodes coming up at once cannot turn heartbeats
  // into an O(N^2) flood. A node refused now keeps its version and asks on its next beat.
  auto now = Clock::now();
  double rate = std::max(1, cfg_.view_records_per_s);
  double cap = std::max(rate, static_cast<double>(alive_nodes_));
  view_tokens_ = std::min(cap, view_tokens_ + rate * std::chrono::duration<double>(now - view_refill_).count());
  view_refill_ = now;
  constexpr uint64_t kFreeDelta = 64;
  // A delta when the log covers every change after `version` and there are at most half as
  // many changes as nodes. The log holds one entry per version, so this test is O(1).
  uint64_t behind = view_version_ - version;
  if (version >= view_log_floor_ && version < view_version_ && !view_log_.empty() &&
      (behind <= kFreeDelta || behind <= nodes_.size() / 2)) {
    if (behind > kFreeDelta && view_tokens_ < static_cast<double>(behind)) {
      reply->set_view_version(version);
      return;
    }
    size_t from = static_cast<size_t>(version + 1 - view_log_.front().first);
    std::vector<const std::string*> changed;
    changed.reserve(behind);
    for (size_t i = from; i < view_log_.size(); ++i) {
      if (view_log_[i].second) changed.push_back(view_log_[i].second);
    }
    std::sort(changed.begin(), changed.end());
    changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
    if (behind > kFreeDelta) view_tokens_ -= static_cast<double>(changed.size());
    reply->set_view_delta(true);
    for (const std::string* id : changed) {
      auto it = nodes_.find(*id);
      if (it == nodes_.end() || !it->second.alive) {
        reply->add_removed_node_ids(*id);
      } else {
        FillRecord(names_, it->first, it->second, /*full=*/false, reply->add_nodes());
      }
    }
    return;
  }
  // The whole view.
  if (view_tokens_ < static_cast<double>(alive_nodes_)) {
    reply->set_view_version(version);
    return;
  }
  // One serialization of the whole view serves every node that needs it: rebuilt when the view
  // changed, at most once a second while the log still covers the snapshot's version (its
  // receivers then catch up by deltas).
  bool stale = snapshot_version_ != view_version_;
  bool usable = snapshot_version_ >= view_log_floor_ && snapshot_version_ > 0;
  if (stale && (!usable || now - snapshot_built_ >= std::chrono::seconds(1))) {
    rpc::ListReply view;
    for (const auto& [id, n] : nodes_) {
      if (n.alive) FillRecord(names_, id, n, /*full=*/false, view.add_nodes());
    }
    view.SerializeToString(&snapshot_);
    snapshot_version_ = view_version_;
    snapshot_nodes_ = alive_nodes_;
    snapshot_built_ = now;
  }
  if (version == snapshot_version_) {  // nothing newer to give than what it has
    reply->set_view_version(version);
    return;
  }
  view_tokens_ -= static_cast<double>(snapshot_nodes_);
  reply->set_view_version(snapshot_version_);
  reply->set_view_snapshot(snapshot_);
}

uint32_t Head::PacedHeartbeatMsLocked() const {
  if (cfg_.max_heartbeats_per_s <= 0) return 0;
  return static_cast<uint32_t>((alive_nodes_ * 1000 + cfg_.max_heartbeats_per_s - 1) /
                               static_cast<size_t>(cfg_.max_heartbeats_per_s));
}

void Head::MonitorLoop() {
  while (!stopping_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::lock_guard<std::mutex> lock(mu_);
    auto now = Clock::now();
    // A head that did not run for a while (starved, stopped, swapped out) cannot tell a silent
    // node from its own absence: that gap does not count against any node.
    if (last_monitor_ != Clock::time_point{} && now - last_monitor_ > std::chrono::seconds(1)) {
      auto gap = now - last_monitor_;
      TORUS_LOG(WARNING) << "node monitor did not run for "
                         << std::chrono::duration_cast<std::chrono::milliseconds>(gap).count()
                         << " ms; heartbeat deadlines moved by that much";
      for (auto& [id, n] : nodes_) n.last_heartbeat += gap;
    }
    last_monitor_ = now;
    for (auto& [id, n] : nodes_) {
      if (!n.alive) continue;
      int64_t timeout_ms = std::max<int64_t>(cfg_.node_timeout_ms,
                                             int64_t{kMissedHeartbeats} * n.beat_ms);
      if (now - n.last_heartbeat > std::chrono::milliseconds(timeout_ms)) {
        n.alive = false;
        --alive_nodes_;
        IndexNodeLocked(id, n);
        BumpView(&id);
        TORUS_LOG(WARNING) << "node " << id << " missed heartbeats for " << timeout_ms
                           << " ms: declared dead";
        for (auto& [aid, a] : actors_) {
          if (a.rec.node_id() == id && a.rec.state() == "ALIVE") {
            OnActorWorkerGone(a, "its node " + id + " died", false);
          }
        }
        OnNodeLostForPgs(id);
      }
    }
    SchedulePendingActors();
  }
}

// ------------------------------------------------------------------------------- actors

grpc::Status Head::CreateActor(grpc::ServerContext* ctx, const rpc::CreateActorRequest* req,
                               rpc::CreateActorReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  const std::string& id = req->creation().actor_id();
  if (id.empty()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, "actor id missing");
    return grpc::Status::OK;
  }
  if (auto s = ValidateResources(FromProto(req->resources()), "actor resources");
      !s.ok()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, s.message());
    return grpc::Status::OK;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (actors_.count(id)) return grpc::Status::OK;  // retried request
  if (!req->name().empty()) {
    auto key = std::make_pair(req->ray_namespace(), req->name());
    auto it = named_actors_.find(key);
    if (it != named_actors_.end() && actors_.count(it->second) &&
        actors_[it->second].rec.state() != "DEAD") {
      SetError(reply->mutable_error(), StatusCode::kAlreadyExists,
               "an actor named '" + req->name() + "' already exists in namespace '" +
                   req->ray_namespace() + "'");
      return grpc::Status::OK;
    }
    named_actors_[key] = id;
  }
  std::map<std::string, std::string> sel;
  for (const auto& t : req->label_selector()) sel[t.key()] = t.expr();
  auto terms = ParseLabelSelector(sel);
  if (!terms.ok()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, terms.status().message());
    if (!req->name().empty()) named_actors_.erase({req->ray_namespace(), req->name()});
    return grpc::Status::OK;
  }
  if (!req->placement_group_id().empty()) {
    auto pit = pgs_.find(req->placement_group_id());
    if (pit == pgs_.end() || pit->second.rec.state() == "REMOVED") {
      SetError(reply->mutable_error(), StatusCode::kNotFound,
               "placement group " + req->placement_group_id() + " does not exist (or was removed)");
      if (!req->name().empty()) named_actors_.erase({req->ray_namespace(), req->name()});
      return grpc::Status::OK;
    }
    if (req->bundle_index() >= pit->second.rec.bundles_size()) {
      SetError(reply->mutable_error(), StatusCode::kInvalidArgument,
               "bundle index " + std::to_string(req->bundle_index()) + " out of range: the group has " +
                   std::to_string(pit->second.rec.bundles_size()) + " bundles");
      if (!req->name().empty()) named_actors_.erase({req->ray_namespace(), req->name()});
      return grpc::Status::OK;
    }
  }
  ActorEntry& a = actors_[id];
  a.selector = *terms;
  a.spec = *req;
  a.rec.set_actor_id(id);
  a.rec.set_name(req->name());
  a.rec.set_ray_namespace(req->ray_namespace());
  a.rec.set_state("PENDING");
  a.rec.set_max_restarts(req->max_restarts());
  a.rec.set_class_name(req->creation().function());
  a.rec.set_job_id(req->creation().job_id());
  a.rec.set_detached(req->detached());
  SchedulePendingActors();
  return grpc::Status::OK;
}

void Head::SchedulePendingActors() {
  for (auto& [id, a] : actors_) {
    if (a.placing || (a.rec.state() != "PENDING" && a.rec.state() != "RESTARTING")) continue;
    ResourceMap res = FromProto(a.spec.resources());
    ResourceMap placement = res.empty() ? ResourceMap{{"CPU", 1}} : res;
    if (!a.spec.placement_group_id().empty()) {
      // Inside a placement group: the bundle's node; the node checks the bundle's room.
      auto pit = pgs_.find(a.spec.placement_group_id());
      if (pit == pgs_.end() || pit->second.rec.state() == "REMOVED") {
        a.rec.set_state("DEAD");
        a.rec.set_death_cause("its placement group was removed");
        cv_.notify_all();
        continue;
      }
      if (pit->second.rec.state() != "CREATED") continue;  // wait for the group
      const rpc::Bundle* target = nullptr;
      for (const auto& b : pit->second.rec.bundles()) {
        if (a.spec.bundle_index() >= 0 && b.index() != a.spec.bundle_index()) continue;
        if (Fits(res, FromProto(b.resources()))) {
          target = &b;
          break;
        }
      }
      if (!target) {
        std::string reason = "asks " + ResourcesToString(res) + ", more than its bundle holds";
        if (reason != a.pending_reason) {
          TORUS_LOG(WARNING) << "actor " << id << " " << reason << "; it stays pending";
          a.pending_reason = reason;
        }
        continue;
      }
      a.placing = true;
      a.pending_reason.clear();
      std::thread([this, id = id, nid = target->node_id(), addr = target->node_address()] {
        PlaceActor(id, nid, addr);
      }).detach();
      continue;
    }
    // Least-loaded feasible node, by free CPU.
    const std::string* best = nullptr;
    double best_cpu = 0;
    bool feasible = false;
    for (const auto& [nid, n] : nodes_) {
      if (!n.alive) continue;
      if (!a.selector.empty() && !MatchesLabels(a.selector, LabelsOf(names_, nid, n))) continue;
      if (Fits(placement, ToResourceMap(names_, n.total))) feasible = true;
      auto avail = ToResourceMap(names_, n.Available());
      if (!Fits(placement, avail)) continue;
      if (!best || avail["CPU"] > best_cpu) {
        best = &nid;
        best_cpu = avail["CPU"];
      }
    }
    if (!best) {
      std::string reason = feasible ? "waiting for resources " + ResourcesToString(placement)
                                    : "infeasible: no node has " + ResourcesToString(placement);
      if (reason != a.pending_reason) {
        TORUS_LOG(INFO) << "actor " << id << " (" << a.rec.class_name() << ") " << reason;
        a.pending_reason = reason;
      }
      continue;
    }
    a.placing = true;
    a.pending_reason.clear();
    // Charge the view now so that a burst of creations spreads out.
    NodeEntry& target = nodes_[*best];
    auto avail = ToResourceMap(names_, target.Available());
    Subtract(avail, placement);
    SetAvailable(names_, avail, &target);
    std::thread([this, id = id, nid = *best, addr = target.address] {
      PlaceActor(id, nid, addr);
    }).detach();
  }
}

void Head::PlaceActor(const std::string& actor_id, const std::string& node_id,
                      const std::string& node_address) {
  rpc::StartActorRequest req;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = actors_.find(actor_id);
    if (it == actors_.end() || stopping_) return;
    const auto& spec = it->second.spec;
    *req.mutable_creation() = spec.creation();
    req.mutable_creation()->set_restarted(it->second.rec.num_restarts() > 0);
    req.set_executable(spec.executable());
    req.mutable_code_search_path()->CopyFrom(spec.code_search_path());
    *req.mutable_resources() = spec.resources();
    req.set_placement_group_id(spec.placement_group_id());
    req.set_bundle_index(spec.bundle_index());
    it->second.rec.set_node_id(node_id);
  }
  auto stub = rpc::Node::NewStub(GetChannel(node_address));
  rpc::StartActorReply reply;
  auto ctx = NewContext(cfg_.token);
  auto st = stub->StartActor(ctx.get(), req, &reply);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = actors_.find(actor_id);
  if (it == actors_.end()) return;
  ActorEntry& a = it->second;
  a.placing = false;
  if (a.rec.state() == "DEAD") {  // killed while being placed
    if (st.ok() && reply.ok()) {
      a.rec.set_worker_id(reply.worker_id());
      KillActorWorker(a.rec);
    }
    return;
  }
  if (!st.ok() || (reply.has_error() && reply.error().code() ==
                                            static_cast<int>(StatusCode::kResourceExhausted))) {
    // Node unreachable or its resources were taken meanwhile: try again later.
    a.rec.set_node_id("");
    cv_.notify_all();
    return;
  }
  if (!reply.ok()) {
    a.rec.set_state("DEAD");
    a.rec.set_death_cause("the actor's constructor failed: " + reply.error().message());
    TORUS_LOG(WARNING) << "actor " << actor_id << " " << a.rec.death_cause();
    cv_.notify_all();
    return;
  }
  a.rec.set_state("ALIVE");
  a.rec.set_worker_id(reply.worker_id());
  a.rec.set_address(reply.worker_address());
  cv_.notify_all();
}

void Head::KillActorWorker(const rpc::ActorRecord& rec) {
  auto it = nodes_.find(rec.node_id());
  if (it == nodes_.end() || rec.worker_id().empty()) return;
  std::string addr = it->second.address;
  std::string wid = rec.worker_id();
  std::string token = cfg_.token;
  std::thread([addr, wid, token] {
    auto stub = rpc::Node::NewStub(GetChannel(addr));
    rpc::KillWorkerRequest req;
    req.set_worker_id(wid);
    req.set_force(true);
    rpc::Empty e;
    auto ctx = NewContext(token, 5000);
    (void)stub->KillWorker(ctx.get(), req, &e);
  }).detach();
}

void Head::OnActorWorkerGone(ActorEntry& a, const std::string& cause, bool intentional) {
  if (a.rec.state() == "DEAD") return;
  int max = a.rec.max_restarts();
  bool can_restart = !intentional && !a.no_restart && (max < 0 || a.rec.num_restarts() < max);
  a.rec.set_address("");
  a.rec.set_worker_id("");
  if (can_restart) {
    a.rec.set_state("RESTARTING");
    a.rec.set_num_restarts(a.rec.num_restarts() + 1);
    TORUS_LOG(INFO) << "actor " << a.rec.actor_id() << " restarting (" << a.rec.num_restarts()
                    << "/" << (max < 0 ? std::string("inf") : std::to_string(max))
                    << ") because " << cause;
  } else {
    a.rec.set_state("DEAD");
    a.rec.set_death_cause(cause);
  }
  cv_.notify_all();
}

grpc::Status Head::ActorStarted(grpc::ServerContext* ctx, const rpc::ActorStartedRequest*,
                                rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  return grpc::Status::OK;  // placement reports through StartActor's reply
}

grpc::Status Head::ActorWorkerDied(grpc::ServerContext* ctx, const rpc::ActorWorkerDiedRequest* req,
                                   rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = actors_.find(req->actor_id());
  if (it == actors_.end()) return grpc::Status::OK;
  ActorEntry& a = it->second;
  // Ignore a stale report about an earlier incarnation.
  if (!req->worker_id().empty() && req->worker_id() != a.rec.worker_id()) return grpc::Status::OK;
  std::string cause = req->description();
  if (a.no_restart) cause = "the actor was killed with ray::KillActor / handle.Kill()";
  if (req->intentional() && cause.empty()) cause = "the actor called ray::ExitActor()";
  OnActorWorkerGone(a, cause, req->intentional());
  SchedulePendingActors();
  return grpc::Status::OK;
}

grpc::Status Head::GetActor(grpc::ServerContext* ctx, const rpc::GetActorRequest* req,
                            rpc::GetActorReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::unique_lock<std::mutex> lock(mu_);
  std::string id = req->actor_id();
  if (id.empty()) {
    auto it = named_actors_.find({req->ray_namespace(), req->name()});
    if (it == named_actors_.end()) return grpc::Status::OK;
    id = it->second;
  }
  auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, req->wait_alive_ms()));
  while (true) {
    auto it = actors_.find(id);
    if (it == actors_.end()) return grpc::Status::OK;
    const auto& rec = it->second.rec;
    bool settled = rec.state() == "DEAD" ||
                   (rec.state() == "ALIVE" && rec.num_restarts() >= req->min_restarts());
    if (settled || req->wait_alive_ms() <= 0 || Clock::now() >= deadline || stopping_ ||
        ctx->IsCancelled()) {
      if (!req->name().empty() && rec.state() == "DEAD") return grpc::Status::OK;
      reply->set_found(true);
      *reply->mutable_actor() = rec;
      return grpc::Status::OK;
    }
    cv_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
  }
}

grpc::Status Head::KillActor(grpc::ServerContext* ctx, const rpc::KillActorRequest* req,
                             rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = actors_.find(req->actor_id());
  if (it == actors_.end()) return grpc::Status::OK;
  ActorEntry& a = it->second;
  if (req->no_restart()) a.no_restart = true;
  if (a.rec.state() == "ALIVE") {
    KillActorWorker(a.rec);
  } else if (req->no_restart() && a.rec.state() != "DEAD") {
    a.rec.set_state("DEAD");
    a.rec.set_death_cause("the actor was killed before it started");
    cv_.notify_all();
  }
  return grpc::Status::OK;
}

// ------------------------------------------------------------------------------- jobs

grpc::Status Head::RegisterJob(grpc::ServerContext* ctx, const rpc::JobRequest* req, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  jobs_[req->job_id()] = *req;
  return grpc::Status::OK;
}

grpc::Status Head::FinishJob(grpc::ServerContext* ctx, const rpc::JobRequest* req, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  FinishJobLocked(req->job_id());
  return grpc::Status::OK;
}

grpc::Status Head::WatchJob(grpc::ServerContext* ctx, const rpc::JobRequest* req,
                            grpc::ServerWriter<rpc::Empty>*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  while (!ctx->IsCancelled() && !stopping_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (stopping_) return grpc::Status::OK;
  std::lock_guard<std::mutex> lock(mu_);
  if (jobs_.count(req->job_id())) {
    TORUS_LOG(WARNING) << "driver of job " << req->job_id() << " went away without Shutdown()";
    FinishJobLocked(req->job_id());
  }
  return grpc::Status::OK;
}

void Head::FinishJobLocked(const std::string& job_id) {
  jobs_.erase(job_id);
  // Non-detached actors and placement groups die with the job that created them.
  for (auto& [id, a] : actors_) {
    if (a.rec.job_id() != job_id || a.rec.detached() || a.rec.state() == "DEAD") continue;
    a.no_restart = true;
    if (a.rec.state() == "ALIVE") KillActorWorker(a.rec);
    a.rec.set_state("DEAD");
    a.rec.set_death_cause("the job that created the actor finished");
  }
  std::vector<NodeCall> release;
  for (auto& [id, e] : pgs_) {
    if (e.rec.job_id() != job_id || e.rec.detached() || e.rec.state() == "REMOVED") continue;
    for (auto& r : RemovePgLocked(e, "the job that created it finished")) release.push_back(std::move(r));
  }
  cv_.notify_all();
  if (!release.empty()) std::thread([this, release] { ReleaseOnNodes(release); }).detach();
}

grpc::Status Head::List(grpc::ServerContext* ctx, const rpc::Empty*, rpc::ListReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, n] : nodes_) FillRecord(names_, id, n, /*full=*/true, reply->add_nodes());
  for (const auto& [id, a] : actors_) *reply->add_actors() = a.rec;
  for (const auto& [id, j] : jobs_) *reply->add_jobs() = j;
  for (const auto& [id, e] : pgs_) *reply->add_placement_groups() = e.rec;
  return grpc::Status::OK;
}

// ------------------------------------------------------------------------------- placement groups

grpc::Status Head::CreatePlacementGroup(grpc::ServerContext* ctx, const rpc::PlacementGroupRecord* req,
                                        rpc::CreatePlacementGroupReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  auto fail = [&](const std::string& msg) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, msg);
    return grpc::Status::OK;
  };
  PgStrategy strategy;
  if (!ParsePgStrategy(req->strategy(), &strategy)) {
    return fail("unknown placement strategy '" + req->strategy() +
                "' (expected PACK, SPREAD, STRICT_PACK or STRICT_SPREAD)");
  }
  if (req->bundles_size() == 0) return fail("a placement group needs at least one bundle");
  PgEntry e;
  e.rec = *req;
  for (int i = 0; i < req->bundles_size(); ++i) {
    auto* b = e.rec.mutable_bundles(i);
    b->set_index(i);
    b->clear_node_id();
    b->clear_node_address();
    // In name order, as the first offending resource is named.
    std::map<std::string_view, double> res;
    for (const auto& [k, v] : b->resources().amounts()) res.emplace(k, v);
    if (auto s = ValidateResources(FromProto(b->resources()), "bundle " + std::to_string(i));
        !s.ok()) {
      return fail(s.message());
    }
    bool any = false;
    for (const auto& [k, v] : res) any = any || v > 0;
    if (!any) return fail("bundle " + std::to_string(i) + " is empty: give it at least one resource");
    // The bundles of a slice reservation all carry the same selector: parse it once.
    auto same_selector = [&](const rpc::Bundle& prev) {
      if (prev.label_selector_size() != b->label_selector_size()) return false;
      for (int k = 0; k < b->label_selector_size(); ++k) {
        if (prev.label_selector(k).key() != b->label_selector(k).key() ||
            prev.label_selector(k).expr() != b->label_selector(k).expr()) {
          return false;
        }
      }
      return true;
    };
    if (i > 0 && same_selector(e.rec.bundles(i - 1))) {
      e.selectors.push_back(e.selectors.back());
      continue;
    }
    std::map<std::string, std::string> sel;
    for (const auto& t : b->label_selector()) sel[t.key()] = t.expr();
    auto terms = ParseLabelSelector(sel);
    if (!terms.ok()) return fail("bundle " + std::to_string(i) + ": " + terms.status().message());
    e.selectors.push_back(*terms);
  }
  if (req->has_slice() && req->slice().num_slices() > 0) {
    const auto& sl = req->slice();
    auto shape = tpu::ComputeSliceShape(sl.accelerator_version(), sl.topology(),
                                        sl.chips_per_vm() > 0 ? std::optional<int>(sl.chips_per_vm())
                                                              : std::nullopt);
    if (!shape.ok()) return fail(shape.status().message());
    if (req->bundles_size() % sl.num_slices() != 0) return fail("slice bundles do not divide evenly");
    auto* out = e.rec.mutable_slice();
    out->set_pod_type(shape->pod_type);
    out->set_hosts_per_slice(shape->hosts);
    out->set_chips_per_host(shape->chips_per_host);
    out->set_bundles_per_slice(req->bundles_size() / sl.num_slices());
    out->set_bundles_per_host(std::max(1, out->bundles_per_slice() / shape->hosts));
    e.rec.clear_slice_names();
    for (int i = 0; i < sl.num_slices(); ++i) e.rec.add_slice_names("");
    if (sl.timeout_ms() >= 0) e.deadline = Clock::now() + std::chrono::milliseconds(sl.timeout_ms());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!req->name().empty()) {
    auto it = named_pgs_.find({req->ray_namespace(), req->name()});
    if (it != named_pgs_.end() && pgs_.count(it->second) &&
        pgs_[it->second].rec.state() != "REMOVED") {
      SetError(reply->mutable_error(), StatusCode::kAlreadyExists,
               "a placement group named '" + req->name() + "' already exists");
      return grpc::Status::OK;
    }
  }
  std::string id = RandomHex(14);
  e.rec.set_pg_id(id);
  e.rec.set_state("PENDING");
  e.rec.set_created_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count());
  e.pending_since = Clock::now();
  TrimRemovedPgsLocked();  // here: never while a caller iterates over pgs_
  if (!req->name().empty()) named_pgs_[{req->ray_namespace(), req->name()}] = id;
  pgs_[id] = std::move(e);
  pg_queue_.push_back(id);
  reply->set_pg_id(id);
  if (!pg_scheduling_ && pg_queue_.size() == 1) {
    // Nothing is waiting ahead of it: place it on this thread now (the scheduler thread would
    // pick exactly this group), saving the caller a hand-off and a Wait round trip.
    std::unique_lock<std::mutex> ul(mu_, std::adopt_lock);
    SchedulePgOnce(ul);
    ul.release();
  } else {
    pg_cv_.notify_all();
  }
  auto it = pgs_.find(id);
  reply->set_state(it == pgs_.end() ? "REMOVED" : it->second.rec.state());
  return grpc::Status::OK;
}

void Head::TrimRemovedPgsLocked() {
  while (removed_pgs_.size() > kKeepRemovedPgs) {
    auto it = pgs_.find(removed_pgs_.front());
    if (it != pgs_.end()) {
      if (it->second.scheduling) break;  // its prepare is still being wound down: later
      if (it->second.rec.state() == "REMOVED") {
        const auto& rec = it->second.rec;
        auto n = named_pgs_.find({rec.ray_namespace(), rec.name()});
        if (n != named_pgs_.end() && n->second == rec.pg_id()) named_pgs_.erase(n);
        pgs_.erase(it);
      }
    }
    removed_pgs_.pop_front();
  }
}

std::vector<Head::NodeCall> Head::RemovePgLocked(PgEntry& e, const std::string& why) {
  std::vector<NodeCall> out;
  e.rec.set_state("REMOVED");
  removed_pgs_.push_back(e.rec.pg_id());
  e.rec.set_pending_reason(why);
  for (const auto& name : e.rec.slice_names()) {
    auto h = slice_holder_.find(name);
    if (h != slice_holder_.end() && h->second == e.rec.pg_id()) slice_holder_.erase(h);
  }
  // A group being prepared right now is released by the scheduler thread when it sees REMOVED.
  if (!e.scheduling) {
    std::map<std::string_view, std::vector<int>> by_node;  // node address -> bundle indexes
    for (const auto& b : e.rec.bundles()) {
      if (!b.node_address().empty()) by_node[b.node_address()].push_back(b.index());
    }
    out.reserve(by_node.size());
    for (const auto& [addr, indexes] : by_node) {
      out.push_back({std::string(addr), ReleasePayload(e.rec.pg_id(), indexes, "")});
    }
  }
  for (auto& [id, a] : actors_) {
    if (a.spec.placement_group_id() != e.rec.pg_id() || a.rec.state() == "DEAD") continue;
    a.no_restart = true;
    a.rec.set_state("DEAD");
    a.rec.set_death_cause("its placement group was removed (" + why + ")");
  }
  cv_.notify_all();
  return out;
}

void Head::ReleaseOnNodes(const std::vector<NodeCall>& what) {
  if (what.empty()) return;
  auto results = CallNodes(BundleOp::kRelease, what);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < what.size(); ++i) {
    if (!results[i].status.ok()) {
      TORUS_LOG(WARNING) << "cannot release bundles on " << what[i].address << ": "
                         << results[i].status.error_message();
      continue;
    }
    ApplyLedgerLocked(what[i].address, results[i]);
  }
  pg_cv_.notify_all();
}

std::vector<Head::BundleReply> Head::CallNodes(BundleOp op, const std::vector<NodeCall>& calls) {
  std::vector<BundleReply> out(calls.size());
  struct InFlight {
    rpc::BundlesRequest req;
    rpc::PrepareBundlesReply reply;
    std::unique_ptr<rpc::Node::Stub> stub;
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientAsyncResponseReader<rpc::PrepareBundlesReply>> reader;
  };
  std::vector<InFlight> inflight(calls.size());
  // Nodes with a lane (every real node): one batch, all requests sent before any reply is read.
  const char* method = op == BundleOp::kPrepare  ? "/torus.rpc.Node/PrepareBundles"
                       : op == BundleOp::kCommit ? "/torus.rpc.Node/CommitBundles"
                                                 : "/torus.rpc.Node/ReleaseBundles";
  std::vector<LaneRequest> lane_reqs;
  std::vector<size_t> lane_index;
  std::vector<bool> done(calls.size(), false);
  for (size_t i = 0; i < calls.size(); ++i) {
    const auto& addr = calls[i].address;
    if (InProcessServiceAt(addr) || !HasLane(addr, cfg_.token)) continue;
    lane_reqs.push_back({addr, method, calls[i].payload});
    lane_index.push_back(i);
  }
  if (!lane_reqs.empty()) {
    auto results = LaneCallMany(cfg_.token, lane_reqs, 5000);
    for (size_t k = 0; k < results.size(); ++k) {
      if (!results[k].delivered) continue;  // no lane after all: gRPC below
      auto& r = out[lane_index[k]];
      r.status = results[k].status;
      r.raw = std::move(results[k].reply);
      done[lane_index[k]] = true;
    }
  }
  grpc::CompletionQueue cq;
  int outstanding = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (done[i]) continue;
    const auto& addr = calls[i].address;
    grpc::Status& st = out[i].status;
    // Off the lane (a node in this process, or one without a lane): the request as a message.
    auto& f = inflight[i];
    rpc::BundlesRequest& req = f.req;
    rpc::PrepareBundlesReply& reply = f.reply;
    if (!req.ParseFromString(calls[i].payload)) {
      st = grpc::Status(grpc::StatusCode::INTERNAL, std::string("unparsable bundle request for ") + method);
      continue;
    }
    if (auto* node = dynamic_cast<rpc::Node::Service*>(InProcessServiceAt(addr))) {
      // A node in this process: call it directly.
      DirectCallScope scope;
      grpc::ServerContext sctx;
      st = op == BundleOp::kPrepare  ? node->PrepareBundles(&sctx, &req, &reply)
           : op == BundleOp::kCommit ? node->CommitBundles(&sctx, &req, &reply)
                                     : node->ReleaseBundles(&sctx, &req, &reply);
      continue;
    }
    f.stub = rpc::Node::NewStub(GetChannel(addr));
    f.ctx = NewContext(cfg_.token, 5000);
    f.reader = op == BundleOp::kPrepare  ? f.stub->AsyncPrepareBundles(f.ctx.get(), req, &cq)
               : op == BundleOp::kCommit ? f.stub->AsyncCommitBundles(f.ctx.get(), req, &cq)
                                         : f.stub->AsyncReleaseBundles(f.ctx.get(), req, &cq);
    f.reader->Finish(&reply, &st, reinterpret_cast<void*>(i));
    ++outstanding;
  }
  // Every call carries a deadline, so each completes.
  void* tag;
  bool ok;
  while (outstanding > 0 && cq.Next(&tag, &ok)) --outstanding;
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    BundleReply& r = out[i];
    if (!done[i] && r.status.ok()) r.raw = inflight[i].reply.SerializeAsString();
    if (r.status.ok() && !ParseBundleReply(&r)) {
      r.status = grpc::Status(grpc::StatusCode::INTERNAL, std::string("garbled reply to ") + method);
    }
  }
  return out;
}

void Head::ApplyLedgerLocked(const std::string& node_address, const BundleReply& reply) {
  auto id = node_by_address_.find(node_address);
  if (id == node_by_address_.end()) return;
  auto it = nodes_.find(*id->second);
  if (it == nodes_.end() || it->second.address != node_address) return;
  auto& e = it->second;
  if (reply.ledger_seq < e.ledger_seq) return;
  e.ledger_seq = reply.ledger_seq;
  CompactResources available;
  available.reserve(reply.available.size());
  for (const auto& a : reply.available) available.emplace_back(names_.Intern(reply.Name(a)), a.value);
  // By name id; a name given twice keeps its last amount, as parsing into a map would.
  std::stable_sort(available.begin(), available.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  size_t kept = 0;
  for (size_t k = 0; k < available.size(); ++k) {
    if (kept > 0 && available[kept - 1].first == available[k].first) {
      available[kept - 1] = available[k];
    } else {
      available[kept++] = available[k];
    }
  }
  available.resize(kept);
  if (available != e.Available()) {
    SetAvailable(std::move(available), &e);
    IndexNodeLocked(it->first, e);
    BumpView(&it->first);
  }
}

grpc::Status Head::RemovePlacementGroup(grpc::ServerContext* ctx, const rpc::PlacementGroupRequest* req,
                                        rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::vector<NodeCall> release;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pgs_.find(req->pg_id());
    if (it == pgs_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no placement group " + req->pg_id());
    }
    if (it->second.rec.state() == "REMOVED") return grpc::Status::OK;
    release = RemovePgLocked(it->second, "removed by the user");
  }
  // Synchronously: when Remove returns, the resources are free (and our view says so).
  ReleaseOnNodes(release);
  return grpc::Status::OK;
}

grpc::Status Head::GetPlacementGroup(grpc::ServerContext* ctx, const rpc::PlacementGroupRequest* req,
                                     rpc::GetPlacementGroupReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::unique_lock<std::mutex> lock(mu_);
  std::string id = req->pg_id();
  if (id.empty()) {
    auto it = named_pgs_.find({req->ray_namespace(), req->name()});
    if (it == named_pgs_.end()) return grpc::Status::OK;
    id = it->second;
  }
  auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, req->wait_created_ms()));
  while (true) {
    auto it = pgs_.find(id);
    if (it == pgs_.end()) return grpc::Status::OK;
    const auto& st = it->second.rec.state();
    if (st == "CREATED" || st == "REMOVED" || Clock::now() >= deadline || stopping_ ||
        ctx->IsCancelled()) {
      reply->set_found(true);
      *reply->mutable_pg() = it->second.rec;
      return grpc::Status::OK;
    }
    cv_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
  }
}

void Head::OnNodeLostForPgs(const std::string& node_id) {
  std::vector<NodeCall> release;
  for (auto& [id, e] : pgs_) {
    if (e.rec.state() != "CREATED" && e.rec.state() != "RESCHEDULING") continue;
    if (e.rec.has_slice() && e.rec.slice().num_slices() > 0) {
      // A slice is granted, lost and re-granted whole (docs/tpu.md section 6 "Failure").
      int per = e.rec.slice().bundles_per_slice();
      std::set<int> lost;
      for (const auto& b : e.rec.bundles()) {
        if (b.node_id() == node_id) lost.insert(b.index() / per);
      }
      if (lost.empty()) continue;
      e.rec.set_epoch(e.rec.epoch() + 1);
      std::map<std::string, rpc::BundlesRequest> by_node;
      for (int si : lost) {
        std::string slice = e.rec.slice_names(si);
        std::string reason = "SliceLost: slice '" + slice + "' (slice index " + std::to_string(si) +
                             ") of reservation " + id + " lost node " + node_id + "; epoch " +
                             std::to_string(e.rec.epoch());
        TORUS_LOG(WARNING) << reason;
        for (auto& b : *e.rec.mutable_bundles()) {
          if (b.index() / per != si) continue;
          if (!b.node_address().empty() && b.node_id() != node_id) {
            auto& r = by_node[b.node_address()];
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
      for (auto& [addr, r] : by_node) release.push_back({addr, r.SerializeAsString()});
      // Every task and actor of a slice reservation fails: the program cannot go on without
      // the lost slice. Actors in it die (restartable ones come back after the re-grant).
      for (auto& [aid, a] : actors_) {
        if (a.spec.placement_group_id() == id && a.rec.state() == "ALIVE") {
          KillActorWorker(a.rec);
        }
      }
      if (e.rec.state() == "CREATED") {
        e.rec.set_state("RESCHEDULING");
        e.pending_since = Clock::now();
        e.tried_view = 0;
        pg_queue_.push_front(id);
      }
      continue;
    }
    bool hit = false;
    for (auto& b : *e.rec.mutable_bundles()) {
      if (b.node_id() == node_id) {
        b.clear_node_id();
        b.clear_node_address();
        hit = true;
      }
    }
    if (!hit) continue;
    TORUS_LOG(WARNING) << "placement group " << id << " lost bundles on node " << node_id
                       << ": RESCHEDULING";
    if (e.rec.state() == "CREATED") {
      e.rec.set_state("RESCHEDULING");
      e.pending_since = Clock::now();
      e.tried_view = 0;
      pg_queue_.push_front(id);  // repairs go first
    }
  }
  if (!release.empty()) std::thread([this, release] { ReleaseOnNodes(release); }).detach();
  pg_cv_.notify_all();
}

std::vector<NodeView> Head::ViewOfNodes(std::map<std::string, int>* index_of, bool with_labels) {
  std::vector<NodeView> view;
  view.reserve(alive_nodes_);
  for (const auto& [nid, n] : nodes_) {
    if (!n.alive) continue;
    (*index_of)[nid] = static_cast<int>(view.size());
    view.push_back({nid, ToResourceMap(names_, n.total), ToResourceMap(names_, n.Available()),
                    with_labels ? LabelsOf(names_, nid, n) : std::map<std::string, std::string>()});
  }
  return view;
}

std::optional<std::vector<std::string>> Head::PlaceSlices(PgEntry& e,
                                                          std::vector<std::string>* slice_names,
                                                          std::string* reason) {
  const auto& sl = e.rec.slice();
  const std::string& pod = sl.pod_type();
  int per = sl.bundles_per_slice(), b_per_host = std::max(1, sl.bundles_per_host());
  std::vector<std::string> out(e.rec.bundles_size());
  *slice_names = std::vector<std::string>(e.rec.slice_names().begin(), e.rec.slice_names().end());
  std::set<std::string> used(slice_names->begin(), slice_names->end());
  auto labels_match = [&](int bundle, const std::string& node_id) {
    if (e.selectors[bundle].empty()) return true;
    auto it = nodes_.find(node_id);
    if (it == nodes_.end()) return false;
    // Read in place: a map of the node's labels per bundle cost ~5% of the head's CPU per
    // 64-host reservation.
    return MatchesLabels(e.selectors[bundle], NodeLabels{names_, it->first, it->second});
  };
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
    const auto& idle = slice_index_.Idle(pod);
    const SliceIndex::Slice* pick = slice_index_.FirstIdle(pod, wanted, [&](const SliceIndex::Slice& s) {
      if (slice_holder_.count(s.name) || used.count(s.name)) return false;
      if (static_cast<int>(s.hosts.size()) * b_per_host < per) return false;
      if (sl.chips_per_vm() > 0) {
        for (int c : s.chips) {
          if (c != sl.chips_per_vm()) return false;
        }
      }
      for (int k = 0; k < per; ++k) {
        if (!labels_match(si * per + k, std::string(s.hosts[k / b_per_host]))) return false;
      }
      return true;
    });
    bool found = pick != nullptr;
    if (found) {
      for (int k = 0; k < per; ++k) out[si * per + k] = std::string(pick->hosts[k / b_per_host]);
      (*slice_names)[si] = pick->name;
      used.insert(pick->name);
    }
    if (!found) {
      int ready = 0;
      for (const auto& name : idle) ready += !slice_holder_.count(name);
      int intact = slice_index_.NumIntact(pod);
      *reason = "waiting for " + std::to_string(sl.num_slices()) + " idle " + pod + " slice(s) (" +
                sl.topology() + "): " + std::to_string(intact) + " intact, " +
                std::to_string(ready) + " ready";
      if (intact == 0) *reason += "; no such slice is in the cluster: it waits until one joins";
      return std::nullopt;
    }
  }
  return out;
}

void Head::SetSliceEnvLocked(PgEntry& e, const std::vector<std::string>& placed_ids) {
  // docs/tpu.md section 7 "Multislice": every process in a bundle of a multislice reservation
  // gets MEGASCALE_* naming host 0 of slice 0 of this grant; a single-slice one gets none.
  const auto& sl = e.rec.slice();
  int per = std::max(1, sl.bundles_per_slice());
  std::string host;
  if (sl.num_slices() > 1 && !placed_ids.empty()) {
    auto it = nodes_.find(placed_ids[0]);
    std::string addr = it == nodes_.end() ? std::string() : it->second.address;
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

void Head::IndexNodeLocked(const std::string& node_id, const NodeEntry& n) {
  if (!n.alive) {
    slice_index_.Remove(node_id);
    return;
  }
  auto label = [&](std::string_view k) { return LabelOf(names_, node_id, n, k); };
  std::string pod_type = label(tpu::kLabelPodType);
  if (pod_type.empty()) {
    slice_index_.Remove(node_id);
    return;
  }
  auto amount = [&](const CompactResources& r, const std::string& k) { return Amount(names_, r, k); };
  std::string head = SliceIdleRule::HeadUnit(pod_type);
  SliceHostUse use{amount(n.total, "TPU"), amount(n.Available(), "TPU"), amount(n.total, head),
                   amount(n.Available(), head)};
  SliceHostInfo info = MakeSliceHostInfo(std::move(pod_type), label(tpu::kLabelSliceName),
                                         label(tpu::kLabelTopology), label(tpu::kLabelWorkerId), use);
  slice_index_.Upsert(node_id, info);
}

grpc::Status Head::QuerySlices(grpc::ServerContext* ctx, const rpc::SliceQueryRequest* req,
                               rpc::SliceQueryReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int> index_of;
  auto view = ViewOfNodes(&index_of, /*with_labels=*/true);
  if (!req->topology().empty() || !req->accelerator_version().empty()) {
    auto shape = tpu::ComputeSliceShape(req->accelerator_version(), req->topology(),
                                        req->chips_per_vm() > 0 ? std::optional<int>(req->chips_per_vm())
                                                                : std::nullopt);
    if (!shape.ok()) {
      SetError(reply->mutable_error(), StatusCode::kInvalidArgument, shape.status().message());
      return grpc::Status::OK;
    }
    for (const auto& s : FindSlices(view, *shape, req->chips_per_vm() > 0
                                                      ? std::optional<int>(req->chips_per_vm())
                                                      : std::nullopt)) {
      reply->set_intact(reply->intact() + s.intact);
      reply->set_ready(reply->ready() + (s.idle && !slice_holder_.count(s.name)));
    }
  }
  for (const auto& s : AllSlices(view)) {
    auto* out = reply->add_slices();
    out->set_name(s.name);
    out->set_pod_type(s.pod_type);
    out->set_topology(s.topology);
    out->set_hosts_expected(s.hosts_expected);
    int alive = 0;
    for (int h : s.hosts) {
      alive += h >= 0;
      out->add_node_ids(h >= 0 ? view[h].id : "");
    }
    out->set_hosts_alive(alive);
    auto holder = slice_holder_.find(s.name);
    out->set_holder(holder == slice_holder_.end() ? "" : holder->second);
    out->set_state(!s.intact ? "broken" : holder != slice_holder_.end() ? "reserved" : "free");
    if (s.name == req->slice_name()) {
      for (int h : s.hosts) {
        if (h >= 0) reply->add_node_ids(view[h].id);
      }
    }
  }
  // A slice with a name the head knows only partially (e.g. missing hosts) still lists its nodes.
  if (!req->slice_name().empty() && reply->node_ids_size() == 0) {
    std::map<int, std::string> by_worker;
    for (const auto& v : view) {
      auto it = v.labels.find(std::string(tpu::kLabelSliceName));
      if (it == v.labels.end() || it->second != req->slice_name()) continue;
      auto w = v.labels.find(std::string(tpu::kLabelWorkerId));
      int wid = 0;
      try {
        wid = w == v.labels.end() ? 0 : std::stoi(w->second);
      } catch (...) {
      }
      by_worker[wid] = v.id;
    }
    for (const auto& [w, id] : by_worker) reply->add_node_ids(id);
  }
  return grpc::Status::OK;
}

void Head::PgLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (pg_scheduling_ || !SchedulePgOnce(lock)) pg_cv_.wait_for(lock, std::chrono::milliseconds(100));
  }
}

bool Head::SchedulePgOnce(std::unique_lock<std::mutex>& lock) {
  constexpr auto kAging = std::chrono::seconds(1);
  {
    // Pick the first group, in arrival order, that can be placed on the current view. A group
    // that could fit an idle cluster but has waited longer than kAging blocks the groups behind
    // it, so a stream of small groups cannot starve a large one.
    std::string chosen;
    std::vector<std::string> placed_ids;  // node id per bundle
    for (auto it = pg_queue_.begin(); it != pg_queue_.end();) {
      auto pit = pgs_.find(*it);
      if (pit == pgs_.end() ||
          (pit->second.rec.state() != "PENDING" && pit->second.rec.state() != "RESCHEDULING")) {
        it = pg_queue_.erase(it);
        continue;
      }
      PgEntry& e = pit->second;
      if (e.rec.state() == "PENDING" && Clock::now() >= e.deadline) {
        std::string why = "DeadlineExceeded: not granted within the timeout (" + e.rec.pending_reason() + ")";
        TORUS_LOG(INFO) << "reservation " << e.rec.pg_id() << ": " << why;
        RemovePgLocked(e, why);  // a pending group holds nothing: no bundles to release
        it = pg_queue_.erase(it);
        continue;
      }
      bool aged = Clock::now() - e.pending_since > kAging;
      // Tried on this very view and failed: wait for the view to change, or for the retry time
      // after a failed call to a node (the view may never change on an idle cluster).
      if (e.tried_view == view_version_ && Clock::now() < e.retry_at) {
        if (aged && e.feasible) break;
        ++it;
        continue;
      }
      auto decide_start = Clock::now();
      auto decided = [&] {
        e.rec.set_decision_us(std::chrono::duration<double, std::micro>(Clock::now() - decide_start).count());
      };
      if (e.rec.has_slice() && e.rec.slice().num_slices() > 0) {
        // Whole idle slices from the live slice index: no scan of the node table.
        std::string reason;
        std::vector<std::string> names;
        auto placed = PlaceSlices(e, &names, &reason);
        if (!placed) {
          e.tried_view = view_version_;
          e.retry_at = Clock::time_point::max();
          e.feasible = false;  // slices never block other requests (spec: no anti-starvation)
          e.rec.set_pending_reason(reason);
          ++it;
          continue;
        }
        for (int i = 0; i < static_cast<int>(names.size()); ++i) {
          if (e.rec.slice_names(i).empty()) slice_holder_[names[i]] = e.rec.pg_id();
          e.rec.set_slice_names(i, names[i]);
        }
        chosen = *it;
        placed_ids = std::move(*placed);
        decided();
        break;
      }
      std::map<std::string, int> index_of;
      // Labels are copied only when some bundle selects on them (10,000 nodes: ~12 each).
      bool with_labels = std::any_of(e.selectors.begin(), e.selectors.end(),
                                     [](const LabelSelectorTerms& t) { return !t.empty(); });
      std::vector<NodeView> view = ViewOfNodes(&index_of, with_labels);
      std::vector<BundleDemand> demands;
      for (int i = 0; i < e.rec.bundles_size(); ++i) {
        const auto& b = e.rec.bundles(i);
        BundleDemand d{FromProto(b.resources()), e.selectors[i], -1};
        if (!b.node_id().empty() && index_of.count(b.node_id())) d.fixed_node = index_of[b.node_id()];
        demands.push_back(d);
      }
      PgStrategy strategy;
      ParsePgStrategy(e.rec.strategy(), &strategy);
      std::vector<NodeView> totals = view;
      e.feasible = PlaceBundles(demands, totals, strategy, /*use_total=*/true).has_value();
      auto placed = PlaceBundles(demands, view, strategy);
      if (!placed) {
        e.tried_view = view_version_;
        e.retry_at = Clock::time_point::max();
        std::string reason = e.feasible ? "waiting for resources"
                                        : "infeasible: no set of nodes can hold these bundles";
        if (reason != e.rec.pending_reason()) {
          TORUS_LOG(INFO) << "placement group " << e.rec.pg_id() << " " << reason;
        }
        e.rec.set_pending_reason(reason);
        if (aged && e.feasible) break;
        ++it;
        continue;
      }
      chosen = *it;
      for (int idx : *placed) placed_ids.push_back(idx >= 0 ? view[idx].id : std::string());
      decided();
      break;
    }
    if (chosen.empty()) return false;
    pg_scheduling_ = true;
    PgEntry& e = pgs_[chosen];
    e.scheduling = true;
    // Group the new bundles by node.
    std::map<std::string, std::vector<int>> by_node;  // node address -> bundle indexes
    std::map<std::string, std::string> node_of_addr;
    if (e.rec.has_slice() && e.rec.slice().num_slices() > 0) SetSliceEnvLocked(e, placed_ids);
    for (int i = 0; i < e.rec.bundles_size(); ++i) {
      if (!e.rec.bundles(i).node_id().empty()) continue;
      const auto& node = nodes_[placed_ids[i]];
      by_node[node.address].push_back(i);
      node_of_addr[node.address] = placed_ids[i];
    }
    // Reserve on every node at once; if any node refused, roll back the ones that reserved.
    // Each node reserves and commits in one step: no task or actor can use a bundle before the
    // group is CREATED here (clients and the actor scheduler only learn a bundle's node from a
    // CREATED group), so a separate commit round would only add a round trip per node. The
    // head's CREATED is the group's commit point. Each node's request is serialised straight
    // from the record (under mu_: the record is not to be read while another thread changes it).
    std::vector<NodeCall> calls;
    calls.reserve(by_node.size());
    for (const auto& [addr, which] : by_node) calls.push_back({addr, BundlesPayload(e.rec, which, /*commit=*/true)});
    lock.unlock();

    std::vector<size_t> answered;  // calls whose node answered (its ledger is in results)
    std::vector<NodeCall> prepared;
    std::string failure;
    auto results = CallNodes(BundleOp::kPrepare, calls);
    for (size_t i = 0; i < calls.size(); ++i) {
      const auto& r = results[i];
      if (r.status.ok()) answered.push_back(i);
      if (r.status.ok() && r.ok) {
        prepared.push_back({calls[i].address, ReleasePayload(chosen, by_node[calls[i].address], "")});
      } else if (failure.empty()) {
        failure = r.status.ok() ? r.error
                                : "prepare on " + calls[i].address + " failed: " + r.status.error_message();
      }
    }
    if (!failure.empty()) {
      // Roll back every prepared bundle: a group never holds part of its bundles.
      ReleaseOnNodes(prepared);
    }

    lock.lock();
    pg_scheduling_ = false;
    for (size_t i : answered) ApplyLedgerLocked(calls[i].address, results[i]);
    auto pit = pgs_.find(chosen);
    if (pit == pgs_.end()) return true;
    PgEntry& done = pit->second;
    done.scheduling = false;
    if (done.rec.state() == "REMOVED") {
      lock.unlock();
      if (failure.empty()) {
        std::vector<NodeCall> undo;
        for (const auto& [addr, which] : by_node) undo.push_back({addr, ReleasePayload(chosen, which, "")});
        ReleaseOnNodes(undo);
      }
      lock.lock();
      return true;
    }
    if (!failure.empty()) {
      if (done.rec.has_slice()) {
        for (int i = 0; i < done.rec.slice_names_size(); ++i) {
          bool placed_here = false;
          for (const auto& b : done.rec.bundles()) {
            placed_here = placed_here || (b.index() / std::max(1, done.rec.slice().bundles_per_slice()) == i &&
                                          !b.node_id().empty());
          }
          if (!placed_here) {
            auto h = slice_holder_.find(done.rec.slice_names(i));
            if (h != slice_holder_.end() && h->second == chosen) slice_holder_.erase(h);
            done.rec.set_slice_names(i, "");
          }
        }
      }
      TORUS_LOG(INFO) << "placement group " << chosen << " not placed yet: " << failure;
      done.tried_view = view_version_;
      done.retry_at = Clock::now() + std::chrono::milliseconds(200);
      done.rec.set_pending_reason("waiting for resources (" + failure + ")");
      pg_cv_.notify_all();
      return true;
    }
    for (const auto& [addr, which] : by_node) {
      const std::string& node_id = node_of_addr[addr];
      for (int i : which) {
        auto* rb = done.rec.mutable_bundles(i);
        rb->set_node_id(node_id);
        rb->set_node_address(addr);
      }
    }
    done.rec.set_state("CREATED");
    done.rec.clear_pending_reason();
    BumpView();
    SchedulePendingActors();
    cv_.notify_all();
    pg_cv_.notify_all();
    return true;
  }
}

grpc::Status Head::Shutdown(grpc::ServerContext* ctx, const rpc::Empty*, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::thread([this] { Stop(); }).detach();
  return grpc::Status::OK;
}

}  // namespace torus
