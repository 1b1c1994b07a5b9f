// Head: the watch ring (docs/fault_tolerance.md, "Finding dead nodes"; the node's side is
// node/peer_watch.h). Each alive node watches the next alive node in nodes_' order; a watcher
// whose link ends reports it here, the head probes the reported node (Node.Ping within
// probe_timeout_ms, twice, 200 ms apart) on a work thread, and declares it dead if neither
// probe reached it. A report of a live node (a flaky link, a confused watcher) costs one
// probe and changes nothing. Heartbeat timeouts stay as the backstop (a hung process whose
// kernel keeps its sockets open).

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "common/logging.h"
#include "common/rpc.h"
#include "head/head.h"

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;
using NodeIt = std::map<std::string, NodeEntry>::const_iterator;
}  // namespace

NodeIt Head::NextAliveLocked(NodeIt it) const {
  if (it == nodes_.end()) return nodes_.end();
  NodeIt j = it;
  for (size_t steps = 0; steps < nodes_.size(); ++steps) {
    if (++j == nodes_.end()) j = nodes_.begin();
    if (j == it) break;
    if (j->second.alive) return j;
  }
  return nodes_.end();
}

rpc::WatchTarget Head::WatchTargetLocked(NodeIt it) const {
  rpc::WatchTarget t;
  if (NodeIt j = NextAliveLocked(it); j != nodes_.end()) {
    t.set_node_id(j->first);
    t.set_address(j->second.address);
  }
  return t;
}

NodeIt Head::WatcherOfLocked(NodeIt it) const {
  if (it == nodes_.end()) return nodes_.end();
  NodeIt j = it;
  for (size_t steps = 0; steps < nodes_.size(); ++steps) {
    if (j == nodes_.begin()) j = nodes_.end();
    --j;
    if (j == it) break;
    if (j->second.alive) return j;
  }
  return nodes_.end();
}

void Head::PushWatchLocked(NodeIt watched, bool join) {
  NodeIt w = WatcherOfLocked(watched);
  if (w == nodes_.end()) return;
  if (join) {
    // A burst of registrations (a cluster coming up) is not pushed node by node: each watcher
    // learns its target from its next heartbeat.
    const auto now = Clock::now();
    join_push_tokens_ = std::min(kJoinPushesPerS, join_push_tokens_ + kJoinPushesPerS *
                                                                          std::chrono::duration<double>(now - join_push_refill_).count());
    join_push_refill_ = now;
    if (join_push_tokens_ < 1) return;
    join_push_tokens_ -= 1;
  }
  PushTargetLocked(w);
}

void Head::PushTargetLocked(NodeIt w) {
  rpc::WatchTarget t = WatchTargetLocked(w);
  (void)work_.Post([this, address = w->second.address, t = std::move(t), token = cfg_.token] {
    if (stopping_) return;
    // A one-off channel: a cached one per pushed node would cost the head ~50 KiB per node.
    auto stub = rpc::Node::NewStub(GetOneOffChannel(address));
    auto ctx = NewContext(token, 2000);
    rpc::Empty e;
    (void)stub->SetWatch(ctx.get(), t, &e);  // a watcher that missed it learns it from its heartbeat
  });
}

grpc::Status Head::ReportPeerLost(grpc::ServerContext* ctx, const rpc::PeerLostRequest* req, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  return ReportPeerLostImpl(*req);
}

grpc::Status Head::ReportPeerLostImpl(const rpc::PeerLostRequest& req) {
  std::string address, why;
  int64_t start_time_ms = 0;
  {
    MutexLock lock(mu_);
    if (stopping_) return grpc::Status::OK;
    auto it = nodes_.find(req.node_id());
    if (it == nodes_.end() || !it->second.alive) {
      // Gone already: the watcher watches a stale target (a push it got out of order, say).
      if (auto w = nodes_.find(req.watcher_id()); w != nodes_.end() && w->second.alive) PushTargetLocked(w);
      return grpc::Status::OK;
    }
    if (!probing_.insert(req.node_id()).second) return grpc::Status::OK;  // probed already
    address = it->second.address;
    start_time_ms = it->second.start_time_ms;
    why = "node " + req.watcher_id() + " reported its watch link to it ended (" + req.how() + ")";
  }
  TORUS_LOG(INFO) << "node " << req.node_id() << ": " << why << "; probing it";
  if (!work_.Post([this, id = req.node_id(), address, start_time_ms, why] { ProbeNode(id, address, start_time_ms, why); })) {
    MutexLock lock(mu_);
    probing_.erase(req.node_id());
  }
  return grpc::Status::OK;
}

namespace {
// Whether the probe reached the node's server: it answered, even with an error of its own (an
// older node without Ping, a token it refuses). Not answered: unreachable, silent, stopping, or
// another node now at that address (FAILED_PRECONDITION).
bool Answered(const grpc::Status& st) {
  switch (st.error_code()) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::INVALID_ARGUMENT:
      return true;
    default:
      return false;
  }
}
}  // namespace

void Head::ProbeNode(const std::string& id, const std::string& address, int64_t start_time_ms, const std::string& why) {
  grpc::Status st(grpc::StatusCode::CANCELLED, "the head is stopping");
  // Two probes, 200 ms apart, each on a channel of its own (a shared one may still be backing off
  // from an old failure): a node is declared dead only when neither reached it, so one lost
  // packet or one slow second does not kill a live node.
  for (int attempt = 0; attempt < 2 && !stopping_; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    grpc::ChannelArguments args;
    args.SetInt("torus.probe", attempt);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = rpc::Node::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    auto ctx = NewContext(cfg_.token, cfg_.probe_timeout_ms);
    rpc::PingRequest req;
    req.set_node_id(id);
    rpc::Empty e;
    st = stub->Ping(ctx.get(), req, &e);
    if (Answered(st)) break;
  }
  MutexLock lock(mu_);
  probing_.erase(id);
  if (stopping_) return;
  if (Answered(st)) {
    TORUS_LOG(INFO) << "node " << id << " answered the head's probe: alive";
    return;
  }
  auto it = nodes_.find(id);
  if (it == nodes_.end() || !it->second.alive || it->second.start_time_ms != start_time_ms) return;
  DeclareDeadLocked(it->first, it->second,
                    why + ", and it did not answer the head's probes (" + st.error_message() + ")");
}

}  // namespace torus
