// HeadClient: see head_client.h.
#include "core/head_client.h"

#include <algorithm>
#include <chrono>

#include "common/ids.h"
#include "common/lane.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/wire_states.h"
#include "core/infeasible_warning.h"
#include "core/throw_status.h"
#include "torus/api/exceptions.h"

namespace torus::core {

namespace {
using Clock = std::chrono::steady_clock;
constexpr int kHeadCallMs = 30000;

void Check(const grpc::Status& st, const char* what) {
  if (!st.ok()) {
    throw internal::RayException(std::string(what) + " failed at the head: " + st.error_message());
  }
}
}  // namespace

HeadClient::HeadClient(std::string address, std::string token,
                       std::function<std::vector<std::string>()> refresh)
    : heads_(address), token_(std::move(token)), refresh_(std::move(refresh)) {}

void HeadClient::HeadFailed(const std::string& failed) {
  heads_.Failed(failed);
  if (!refresh_) return;
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t last = refreshed_ms_.load();
  if (now - last < 1000 || !refreshed_ms_.compare_exchange_strong(last, now)) return;
  auto heads = refresh_();
  // The node's current head first; keep moving away from the one that failed.
  if (!heads.empty()) heads_.Learn(heads, 0);
  if (heads_.current() == failed) heads_.Failed(failed);
}

HeadClient::~HeadClient() { StopWatching(); }

void HeadClient::StopWatching() {
  {
    MutexLock lock(watch_mu_);
    watch_stop_ = true;
    if (watch_ctx_) watch_ctx_->TryCancel();
    watch_cv_.NotifyAll();
  }
  if (watch_thread_.joinable()) watch_thread_.join();
}

grpc::Status HeadClient::RetryWhileHeadAway(const std::function<grpc::Status()>& call) {
  auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(kHeadAwayMs);
  int backoff_ms = 50;
  while (true) {
    const std::string head = heads_.current();
    grpc::Status st = call();
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE || std::chrono::steady_clock::now() >= give_up) return st;
    HeadFailed(head);  // a standby, if one is known, is tried next
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(backoff_ms * 2, 1000);
  }
}

// ------------------------------------------------------------------------------------- jobs

Status HeadClient::RegisterJob(const rpc::JobRequest& job) {
  rpc::Empty e;
  auto ctx = NewContext(token_, 10000);
  auto st = Stub()->RegisterJob(ctx.get(), job, &e);
  if (!st.ok()) return FromGrpc(st, "cannot register the job with the head at " + heads_.current());
  watch_thread_ = std::thread([this, job] { WatchLoop(job); });
  return Status::Ok();
}

void HeadClient::WatchLoop(rpc::JobRequest job) {
  int backoff_ms = 100;
  while (true) {
    std::shared_ptr<grpc::ClientContext> ctx;
    {
      MutexLock lock(watch_mu_);
      if (watch_stop_) return;
      watch_ctx_ = NewContext(token_);
      ctx = watch_ctx_;
    }
    auto reader = Stub()->WatchJob(ctx.get(), job);
    rpc::Empty ping;
    while (reader->Read(&ping)) {
    }
    (void)reader->Finish();
    // The head went away (stopped, or killed and restarted, or a standby took over): once one
    // answers again, the job is registered again and watched, so a resumed head keeps it.
    while (true) {
      MutexLock lock(watch_mu_);
      if (!watch_stop_) watch_cv_.WaitFor(lock, std::chrono::milliseconds(backoff_ms));
      if (watch_stop_) return;
      backoff_ms = std::min(backoff_ms * 2, 2000);
      rpc::Empty e;
      auto rctx = NewContext(token_, 2000);
      const std::string head = heads_.current();
      auto st = rpc::Head::NewStub(GetChannel(head))->RegisterJob(rctx.get(), job, &e);
      if (st.ok()) break;
      if (st.error_code() == grpc::StatusCode::UNAVAILABLE || st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        HeadFailed(head);  // a standby, if one is known, is tried next
      }
    }
    backoff_ms = 100;
  }
}

void HeadClient::FinishJob(const std::string& job_id, int64_t tasks_finished, int64_t tasks_failed) {
  if (!watch_thread_.joinable()) return;
  rpc::JobRequest job;
  job.set_job_id(job_id);
  job.set_tasks_finished(tasks_finished);
  job.set_tasks_failed(tasks_failed);
  rpc::Empty e;
  {
    // From here on the watch registers nothing again (a re-registration in flight ends first).
    MutexLock lock(watch_mu_);
    watch_stop_ = true;
    watch_cv_.NotifyAll();
  }
  auto ctx = NewContext(token_, 5000);
  (void)Stub()->FinishJob(ctx.get(), job, &e);
  StopWatching();
}

// ----------------------------------------------------------------------------------- actors

void HeadClient::CreateActor(const rpc::CreateActorRequest& req) {
  rpc::CreateActorReply reply;
  auto st = Call(&rpc::Head::Stub::CreateActor, req, &reply, 30000);
  if (!st.ok()) throw internal::RayException("cannot create actor: " + st.error_message());
  if (reply.has_error() && reply.error().code() != 0) ThrowStatus(reply.error(), "cannot create actor: ");
  if (!reply.warning().empty()) {
    const std::string named = req.name().empty() ? "" : "'" + req.name() + "' ";
    TORUS_LOG(WARNING) << InfeasibleWarning("actor " + named + "(ID " + req.creation().actor_id() + ")",
                                            req.resources());
  }
}

StatusOr<rpc::GetActorReply> HeadClient::GetActor(const rpc::GetActorRequest& req) {
  rpc::GetActorReply reply;
  auto st = Call(&rpc::Head::Stub::GetActor, req, &reply, 10000);
  if (!st.ok()) return FromGrpc(st, "the head is unreachable");
  return reply;
}

void HeadClient::ReportActorExit(const std::string& actor_id, const std::string& worker_id) {
  rpc::ActorWorkerDiedRequest req;
  req.set_actor_id(actor_id);
  req.set_worker_id(worker_id);
  req.set_intentional(true);
  req.set_description("the actor called ray::ExitActor()");
  rpc::Empty e;
  auto ctx = NewContext(token_, 5000);
  (void)Stub()->ActorWorkerDied(ctx.get(), req, &e);
}

// ------------------------------------------------------------ placement groups and slices

StatusOr<std::string> HeadClient::BundleNode(const std::string& pg_id, int bundle_index,
                                             const ResourceMap& res, int spread,
                                             const std::atomic<bool>& stop) {
  rpc::PlacementGroupRequest req;
  req.set_pg_id(pg_id);
  rpc::GetPlacementGroupReply reply;
  // Wait for the group to be placed: work submitted into a pending group waits for it.
  while (true) {
    reply.Clear();
    req.set_wait_created_ms(2000);
    auto st = RetryWhileHeadAway([&] {
      reply.Clear();
      return LaneUnary(heads_.current(), token_, 10000, "/torus.rpc.Head/GetPlacementGroup",
                       &rpc::Head::Service::GetPlacementGroup, &rpc::Head::Stub::GetPlacementGroup, req, &reply);
    });
    if (!st.ok()) return FromGrpc(st, "cannot look up placement group " + pg_id);
    if (!reply.found()) return NotFound("placement group " + pg_id + " does not exist");
    const auto& pg = reply.pg();
    if (pg.state() == rpc::PlacementGroupRecord::REMOVED) {
      return NotFound("placement group " + pg_id + " was removed");
    }
    if (bundle_index >= pg.bundles_size()) {
      return InvalidArgument("bundle index " + std::to_string(bundle_index) +
                             " out of range: placement group " + pg_id + " has " +
                             std::to_string(pg.bundles_size()) + " bundles");
    }
    if (pg.state() != rpc::PlacementGroupRecord::CREATED) {
      if (stop) return Unavailable("shutting down");
      continue;
    }
    const rpc::Bundle* fallback = nullptr;
    std::vector<const rpc::Bundle*> fitting;
    for (const auto& b : pg.bundles()) {
      if (bundle_index >= 0 && b.index() != bundle_index) continue;
      if (!fallback) fallback = &b;
      if (Fits(res, FromProto(b.resources()))) fitting.push_back(&b);
    }
    // Any bundle: successive lease requests go round the fitting bundles, so concurrent work
    // spreads over the group's bundles (and a slice's hosts) instead of queueing at the first.
    if (!fitting.empty()) return fitting[spread % fitting.size()]->node_address();
    // Asks more than the bundle holds: send it anyway; it stays pending there and is reported.
    return fallback->node_address();
  }
}

std::string HeadClient::CreatePlacementGroup(const internal::PlacementGroupSpec& spec,
                                             const std::string& ray_namespace,
                                             const std::string& job_id) {
  rpc::PlacementGroupRecord req;
  req.set_name(spec.name);
  req.set_ray_namespace(spec.ray_namespace.empty() ? ray_namespace : spec.ray_namespace);
  req.set_strategy(spec.strategy);
  req.set_detached(spec.detached);
  req.set_job_id(job_id);
  if (spec.num_slices > 0) {
    auto* sl = req.mutable_slice();
    sl->set_topology(spec.slice_topology);
    sl->set_accelerator_version(spec.slice_version);
    sl->set_num_slices(spec.num_slices);
    sl->set_chips_per_vm(spec.chips_per_vm);
    sl->set_timeout_ms(spec.slice_timeout_ms);
  }
  if (!spec.bundle_selectors.empty() && spec.bundle_selectors.size() != spec.bundles.size()) {
    ThrowStatus(InvalidArgument("bundle_label_selectors has " +
                                std::to_string(spec.bundle_selectors.size()) + " entries for " +
                                std::to_string(spec.bundles.size()) + " bundles"));
  }
  for (size_t i = 0; i < spec.bundles.size(); ++i) {
    auto* b = req.add_bundles();
    ToProto(ResourceMap(spec.bundles[i].begin(), spec.bundles[i].end()), b->mutable_resources());
    if (!spec.bundle_selectors.empty()) {
      for (const auto& [k, v] : spec.bundle_selectors[i]) {
        auto* t = b->add_label_selector();
        t->set_key(k);
        t->set_expr(v);
      }
    }
  }
  // Our id: a call repeated because the head went away finds the group the first call made.
  req.set_pg_id(NewPgId());
  rpc::CreatePlacementGroupReply reply;
  auto st = RetryWhileHeadAway([&] {
    reply.Clear();
    return LaneUnary(heads_.current(), token_, 10000, "/torus.rpc.Head/CreatePlacementGroup",
                     &rpc::Head::Service::CreatePlacementGroup, &rpc::Head::Stub::CreatePlacementGroup, req, &reply);
  });
  if (!st.ok()) throw internal::RayException("CreatePlacementGroup failed: " + st.error_message());
  if (reply.has_error() && reply.error().code() != 0) ThrowStatus(reply.error(), "CreatePlacementGroup: ");
  if (reply.state() == rpc::PlacementGroupRecord::CREATED) {
    MutexLock lock(mu_);
    created_.insert(reply.pg_id());
  }
  return reply.pg_id();
}

void HeadClient::RemovePlacementGroup(const std::string& id) {
  rpc::PlacementGroupRequest req;
  req.set_pg_id(id);
  rpc::Empty e;
  auto st = RetryWhileHeadAway([&] {
    return LaneUnary(heads_.current(), token_, 30000, "/torus.rpc.Head/RemovePlacementGroup",
                     &rpc::Head::Service::RemovePlacementGroup, &rpc::Head::Stub::RemovePlacementGroup, req, &e);
  });
  if (!st.ok()) throw internal::RayException("RemovePlacementGroup: " + st.error_message());
  MutexLock lock(mu_);
  created_.erase(id);
}

namespace {
internal::PlacementGroupInfo ToInfo(const rpc::PlacementGroupRecord& r) {
  internal::PlacementGroupInfo info;
  info.found = true;
  info.id = r.pg_id();
  info.state = StateName(r.state());
  info.spec.name = r.name();
  info.spec.ray_namespace = r.ray_namespace();
  info.spec.strategy = r.strategy();
  info.spec.detached = r.detached();
  for (const auto& b : r.bundles()) {
    ResourceDoubles amounts = ToDoubles(FromProto(b.resources()));
    info.spec.bundles.emplace_back(amounts.begin(), amounts.end());
    internal::LabelSelector sel;
    for (const auto& t : b.label_selector()) sel[t.key()] = t.expr();
    info.spec.bundle_selectors.push_back(sel);
    info.bundle_nodes.push_back(b.node_id());
  }
  info.slice_names.assign(r.slice_names().begin(), r.slice_names().end());
  info.epoch = r.epoch();
  info.pending_reason = r.pending_reason();
  if (r.has_slice()) {
    info.spec.num_slices = r.slice().num_slices();
    info.spec.slice_topology = r.slice().topology();
    info.spec.slice_version = r.slice().accelerator_version();
    info.spec.chips_per_vm = r.slice().chips_per_host();
  }
  return info;
}
}  // namespace

bool HeadClient::WaitPlacementGroup(const std::string& id, int timeout_seconds) {
  {
    // Placed while CreatePlacementGroup ran: it has been ready, which is what Wait reports.
    MutexLock lock(mu_);
    if (created_.count(id)) return true;
  }
  auto deadline = Clock::now() + std::chrono::seconds(std::max(0, timeout_seconds));
  while (true) {
    rpc::PlacementGroupRequest req;
    req.set_pg_id(id);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    req.set_wait_created_ms(std::max<int64_t>(0, std::min<int64_t>(left, 5000)));
    rpc::GetPlacementGroupReply reply;
    auto st = RetryWhileHeadAway([&] {
      reply.Clear();
      return LaneUnary(heads_.current(), token_, 15000, "/torus.rpc.Head/GetPlacementGroup",
                       &rpc::Head::Service::GetPlacementGroup, &rpc::Head::Stub::GetPlacementGroup, req, &reply);
    });
    if (!st.ok()) throw internal::RayException("PlacementGroup::Wait: " + st.error_message());
    if (!reply.found()) throw internal::RayException("PlacementGroup::Wait: no placement group " + id);
    if (reply.pg().state() == rpc::PlacementGroupRecord::CREATED) return true;
    if (reply.pg().state() == rpc::PlacementGroupRecord::REMOVED) {
      const std::string& why = reply.pg().pending_reason();
      throw internal::RayException("placement group " + id + " was removed" +
                                   (why.empty() ? std::string() : ": " + why));
    }
    if (Clock::now() >= deadline) return false;
  }
}

internal::PlacementGroupInfo HeadClient::GetPlacementGroupInfo(const std::string& id,
                                                               const std::string& name,
                                                               const std::string& ray_namespace) {
  rpc::PlacementGroupRequest req;
  req.set_pg_id(id);
  req.set_name(name);
  req.set_ray_namespace(ray_namespace);
  rpc::GetPlacementGroupReply reply;
  auto st = Call(&rpc::Head::Stub::GetPlacementGroup, req, &reply, 10000);
  if (!st.ok()) throw internal::RayException("GetPlacementGroup: " + st.error_message());
  if (!reply.found()) return {};
  return ToInfo(reply.pg());
}

std::vector<internal::PlacementGroupInfo> HeadClient::GetAllPlacementGroups() {
  rpc::ListReply reply;
  auto st = Call(&rpc::Head::Stub::List, rpc::Empty(), &reply, 10000);
  if (!st.ok()) throw internal::RayException("GetAllPlacementGroups: " + st.error_message());
  std::vector<internal::PlacementGroupInfo> out;
  for (const auto& r : reply.placement_groups()) out.push_back(ToInfo(r));
  return out;
}

internal::SliceQueryResult HeadClient::QuerySlices(const std::string& topology,
                                                   const std::string& version, int chips_per_vm,
                                                   const std::string& slice_name) {
  rpc::SliceQueryRequest req;
  req.set_topology(topology);
  req.set_accelerator_version(version);
  req.set_chips_per_vm(chips_per_vm);
  req.set_slice_name(slice_name);
  rpc::SliceQueryReply reply;
  auto st = Call(&rpc::Head::Stub::QuerySlices, req, &reply, 10000);
  if (!st.ok()) throw internal::RayException("slice query failed: " + st.error_message());
  if (reply.has_error() && reply.error().code() != 0) {
    const auto code = static_cast<StatusCode>(reply.error().code());
    ThrowStatus(reply.error(), std::string(StatusCodeName(code)) + ": ");
  }
  internal::SliceQueryResult out;
  out.intact = reply.intact();
  out.ready = reply.ready();
  out.node_ids.assign(reply.node_ids().begin(), reply.node_ids().end());
  return out;
}

std::string HeadClient::GetNamedActor(const std::string& name, const std::string& ray_namespace) {
  rpc::GetActorRequest req;
  req.set_name(name);
  req.set_ray_namespace(ray_namespace);
  rpc::GetActorReply reply;
  auto st = Call(&rpc::Head::Stub::GetActor, req, &reply, 10000);
  if (!st.ok()) throw internal::RayException("GetActor failed: " + st.error_message());
  if (!reply.found() || reply.actor().state() == rpc::ActorRecord::DEAD) return "";
  return reply.actor().actor_id();
}

void HeadClient::KillActor(const std::string& actor_id, bool no_restart) {
  rpc::KillActorRequest req;
  req.set_actor_id(actor_id);
  req.set_no_restart(no_restart);
  rpc::Empty e;
  auto st = Call(&rpc::Head::Stub::KillActor, req, &e, 10000);
  if (!st.ok()) throw internal::RayException("Kill failed: " + st.error_message());
}

// ------------------------------------------------------------- key-value store, listing

bool HeadClient::KvPut(const std::string& ns, const std::string& key, const std::string& value,
                       bool overwrite) {
  rpc::KvPutRequest req;
  req.set_ns(ns);
  req.set_key(key);
  req.set_value(value);
  req.set_overwrite(overwrite);
  rpc::KvPutReply reply;
  Check(Call(&rpc::Head::Stub::KvPut, req, &reply, kHeadCallMs), "KV put");
  return reply.added();
}

std::optional<std::string> HeadClient::KvGet(const std::string& ns, const std::string& key) {
  rpc::KvGetRequest req;
  req.set_ns(ns);
  req.set_key(key);
  rpc::KvGetReply reply;
  Check(Call(&rpc::Head::Stub::KvGet, req, &reply, kHeadCallMs), "KV get");
  if (!reply.found()) return std::nullopt;
  return std::move(*reply.mutable_value());
}

bool HeadClient::KvDel(const std::string& ns, const std::string& key) {
  rpc::KvGetRequest req;
  req.set_ns(ns);
  req.set_key(key);
  rpc::KvPutReply reply;
  Check(Call(&rpc::Head::Stub::KvDel, req, &reply, kHeadCallMs), "KV delete");
  return reply.added();
}

std::vector<std::string> HeadClient::KvKeys(const std::string& ns, const std::string& prefix) {
  rpc::KvGetRequest req;
  req.set_ns(ns);
  req.set_key(prefix);
  rpc::KvKeysReply reply;
  Check(Call(&rpc::Head::Stub::KvKeys, req, &reply, kHeadCallMs), "KV keys");
  return {reply.keys().begin(), reply.keys().end()};
}

rpc::ListReply HeadClient::ListCluster() {
  rpc::ListReply reply;
  Check(Call(&rpc::Head::Stub::List, rpc::Empty(), &reply, kHeadCallMs), "listing the cluster");
  return reply;
}

}  // namespace torus::core
