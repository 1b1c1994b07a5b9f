#include "head/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <charconv>
#include <chrono>
#include <cstdio>

#include "common/rpc.h"
#include "proto/etcd.grpc.pb.h"

namespace torus {

namespace pb = etcdserverpb;

struct EtcdClient::Stubs {
  std::string endpoint;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Watch::Stub> watch;
};

namespace {

// Keys per Range call of GetPrefix: bounds the size of one response.
constexpr int64_t kPageSize = 500;

// The end of the range of the keys starting with `prefix`: the prefix with its last byte below
// 0xff incremented and what follows it dropped; "\0" (every key from the start on) when the
// prefix has no such byte (empty or all 0xff).
std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

// A prefix range's first key: etcd refuses an empty key ("\0" is the smallest one).
std::string PrefixStart(std::string_view prefix) {
  return prefix.empty() ? std::string(1, '\0') : std::string(prefix);
}

EtcdKv FromPb(const pb::KeyValue& kv) {
  return EtcdKv{kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.lease()};
}

// A compare "`key` exists with create revision `create_revision`" (0: `key` does not exist).
void AddCreateCompare(pb::TxnRequest* txn, std::string_view key, int64_t create_revision) {
  pb::Compare* c = txn->add_compare();
  c->set_result(pb::Compare::EQUAL);
  c->set_target(pb::Compare::CREATE);
  c->set_key(std::string(key));
  c->set_create_revision(create_revision);
}

std::string LeaseName(int64_t lease) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(lease));
  return buf;
}

}  // namespace

EtcdClient::EtcdClient(std::string endpoint, int timeout_ms)
    : endpoint_(std::move(endpoint)), timeout_ms_(timeout_ms) {
  // One uncached insecure channel per member, with the runtime's reconnect settings (etcd knows
  // nothing of the cluster token: no Torus metadata is added by channels, only by contexts).
  for (size_t start = 0; start <= endpoint_.size();) {
    size_t comma = std::min(endpoint_.find(',', start), endpoint_.size());
    auto st = std::make_unique<Stubs>();
    st->endpoint = endpoint_.substr(start, comma - start);
    st->channel = GetOneOffChannel(st->endpoint);
    st->kv = pb::KV::NewStub(st->channel);
    st->lease = pb::Lease::NewStub(st->channel);
    st->watch = pb::Watch::NewStub(st->channel);
    stubs_.push_back(std::move(st));
    start = comma + 1;
  }
}

grpc::Status EtcdClient::OnAny(const std::function<grpc::Status(Stubs&)>& call, std::string* used) {
  const size_t first = current_.load();
  grpc::Status s;
  for (size_t i = 0; i < stubs_.size(); ++i) {
    const size_t at = (first + i) % stubs_.size();
    Stubs& st = *stubs_[at];
    *used = st.endpoint;
    s = call(st);
    // Only a member that could not be reached, or did not answer in time (a hung or cut-off
    // member), is passed over: any other answer is etcd's. Every call we make may be repeated
    // (writes of the same value, fenced transactions, a create-if-absent that then finds its own
    // key, a lease grant whose twin expires unused).
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
        s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      if (at != first) current_.store(at);
      return s;
    }
  }
  return s;
}

EtcdClient::~EtcdClient() = default;

StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const std::string& endpoint,
                                                          int timeout_ms) {
  if (endpoint.empty() || endpoint.front() == ',' || endpoint.back() == ',' ||
      endpoint.find(",,") != std::string::npos) {
    return InvalidArgument("no etcd endpoint given ('" + endpoint + "')");
  }
  if (timeout_ms <= 0) {
    return InvalidArgument("the etcd timeout must be positive, not " + std::to_string(timeout_ms));
  }
  std::unique_ptr<EtcdClient> client(new EtcdClient(endpoint, timeout_ms));
  auto probe = client->Get("/");
  if (!probe.ok()) {
    // An etcd that does not answer in time is as unreachable as one that refuses the connection.
    if (probe.status().code() == StatusCode::kDeadlineExceeded) {
      return Unavailable("etcd at " + endpoint + " did not answer within " +
                         std::to_string(timeout_ms) + " ms: " + probe.status().message());
    }
    return probe.status();
  }
  return client;
}

std::unique_ptr<grpc::ClientContext> EtcdClient::Context(std::chrono::system_clock::time_point by) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::min(by, std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_)));
  return ctx;
}

std::string EtcdClient::What(const char* call, const std::string& used) const {
  return "etcd at " + (used.empty() ? endpoint_ : used) + " (" + call + ")";
}

// ------------------------------------------------------------------------------- reads

StatusOr<std::optional<EtcdKv>> EtcdClient::Get(std::string_view key) {
  pb::RangeRequest req;
  req.set_key(std::string(key));
  pb::RangeResponse rep;
  std::string used;
  grpc::Status s = OnAny([&](Stubs& st) { return st.kv->Range(Context().get(), req, &rep); }, &used);
  if (!s.ok()) return FromGrpc(s, What("Range", used));
  if (rep.kvs_size() == 0) return std::optional<EtcdKv>();
  return std::optional<EtcdKv>(FromPb(rep.kvs(0)));
}

StatusOr<std::vector<EtcdKv>> EtcdClient::GetPrefix(std::string_view prefix) {
  std::vector<EtcdKv> out;
  pb::RangeRequest req;
  req.set_key(PrefixStart(prefix));
  req.set_range_end(PrefixEnd(prefix));
  req.set_limit(kPageSize);
  while (true) {
    pb::RangeResponse rep;
    std::string used;
    grpc::Status s = OnAny([&](Stubs& st) { return st.kv->Range(Context().get(), req, &rep); }, &used);
    if (!s.ok()) return FromGrpc(s, What("Range", used));
    for (const pb::KeyValue& kv : rep.kvs()) out.push_back(FromPb(kv));
    if (!rep.more() || rep.kvs_size() == 0) return out;
    // The next page starts right after this one's last key, at the first page's revision: the
    // pages together are one snapshot of the prefix.
    if (req.revision() == 0) req.set_revision(rep.header().revision());
    req.set_key(rep.kvs(rep.kvs_size() - 1).key() + '\0');
  }
}

StatusOr<int64_t> EtcdClient::CountPrefix(std::string_view prefix) {
  pb::RangeRequest req;
  req.set_key(PrefixStart(prefix));
  req.set_range_end(PrefixEnd(prefix));
  req.set_count_only(true);
  pb::RangeResponse rep;
  std::string used;
  grpc::Status s = OnAny([&](Stubs& st) { return st.kv->Range(Context().get(), req, &rep); }, &used);
  if (!s.ok()) return FromGrpc(s, What("Range", used));
  return rep.count();
}

// ------------------------------------------------------------------------------- writes

Status EtcdClient::Txn(const pb::TxnRequest& req, pb::TxnResponse* rep, const char* call) {
  std::string used;
  grpc::Status s = OnAny([&](Stubs& st) { return st.kv->Txn(Context().get(), req, rep); }, &used);
  return FromGrpc(s, What(call, used));
}

Status EtcdClient::Commit(pb::TxnRequest& req, const EtcdGuard& guard, const char* call) {
  AddCreateCompare(&req, guard.key, guard.create_revision);
  pb::TxnResponse rep;
  if (Status s = Txn(req, &rep, call); !s.ok()) return s;
  if (rep.succeeded()) return Status::Ok();
  return FailedPrecondition(What(call) + ": refused: the guard key '" + guard.key +
                            "' no longer exists with create revision " +
                            std::to_string(guard.create_revision) +
                            ", so this process is no longer the active head");
}

Status EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease,
                       const EtcdGuard& guard) {
  pb::PutRequest put;
  put.set_key(std::string(key));
  put.set_value(std::string(value));
  put.set_lease(lease);
  if (!guard.key.empty()) {
    pb::TxnRequest txn;
    *txn.add_success()->mutable_request_put() = std::move(put);
    return Commit(txn, guard, "Put");
  }
  pb::PutResponse rep;
  std::string used;
  grpc::Status s = OnAny([&](Stubs& st) { return st.kv->Put(Context().get(), put, &rep); }, &used);
  return FromGrpc(s, What("Put", used));
}

Status EtcdClient::Delete(std::string_view key, const EtcdGuard& guard) {
  pb::DeleteRangeRequest del;
  del.set_key(std::string(key));
  if (!guard.key.empty()) {
    pb::TxnRequest txn;
    *txn.add_success()->mutable_request_delete_range() = std::move(del);
    return Commit(txn, guard, "DeleteRange");
  }
  pb::DeleteRangeResponse rep;
  std::string used;
  grpc::Status s = OnAny([&](Stubs& st) { return st.kv->DeleteRange(Context().get(), del, &rep); }, &used);
  return FromGrpc(s, What("DeleteRange", used));
}

StatusOr<EtcdKv> EtcdClient::CreateIfAbsent(std::string_view key, std::string_view value,
                                            int64_t lease) {
  pb::TxnRequest txn;
  AddCreateCompare(&txn, key, 0);
  pb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(std::string(key));
  put->set_value(std::string(value));
  put->set_lease(lease);
  // Either way the transaction ends with a read of the key: ours or the holder's.
  txn.add_success()->mutable_request_range()->set_key(std::string(key));
  txn.add_failure()->mutable_request_range()->set_key(std::string(key));
  pb::TxnResponse rep;
  if (Status s = Txn(txn, &rep, "Txn"); !s.ok()) return s;
  const pb::ResponseOp* last = rep.responses_size() ? &rep.responses(rep.responses_size() - 1) : nullptr;
  if (!last || !last->has_response_range() || last->response_range().kvs_size() == 0) {
    return Internal(What("Txn") + ": the create-if-absent of '" + std::string(key) +
                    "' returned no key");
  }
  return FromPb(last->response_range().kvs(0));
}

// ------------------------------------------------------------------------------- leases

StatusOr<int64_t> EtcdClient::GrantLease(int64_t ttl_s) {
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  pb::LeaseGrantResponse rep;
  std::string used;
  grpc::Status s = OnAny([&](Stubs& st) { return st.lease->LeaseGrant(Context().get(), req, &rep); }, &used);
  if (!s.ok()) return FromGrpc(s, What("LeaseGrant", used));
  if (!rep.error().empty()) return Internal(What("LeaseGrant") + ": " + rep.error());
  return rep.id();
}

StatusOr<int64_t> EtcdClient::KeepAlive(int64_t lease, std::chrono::system_clock::time_point by) {
  pb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  pb::LeaseKeepAliveResponse rep;
  std::string used;
  grpc::Status s = OnAny([&](Stubs& st) {
    if (std::chrono::system_clock::now() >= by) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the renewal's time ran out");
    }
    auto ctx = Context(by);
    auto stream = st.lease->LeaseKeepAlive(ctx.get());
    bool replied = stream->Write(req) && stream->Read(&rep);
    stream->WritesDone();
    grpc::Status f = stream->Finish();
    if (replied) return grpc::Status::OK;
    return f.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream ended without a reply") : f;
  }, &used);
  if (!s.ok()) return FromGrpc(s, What("LeaseKeepAlive", used));
  if (rep.ttl() <= 0) return NotFound(What("LeaseKeepAlive") + ": lease " + LeaseName(lease) + " has expired");
  return rep.ttl();
}

Status EtcdClient::RevokeLease(int64_t lease) {
  pb::LeaseRevokeRequest req;
  req.set_id(lease);
  pb::LeaseRevokeResponse rep;
  std::string used;
  grpc::Status s = OnAny([&](Stubs& st) { return st.lease->LeaseRevoke(Context().get(), req, &rep); }, &used);
  return FromGrpc(s, What("LeaseRevoke", used) + " of lease " + LeaseName(lease));
}

// ------------------------------------------------------------------------------- watches

bool EtcdClient::Register(grpc::ClientContext* ctx) {
  MutexLock l(waits_mu_);
  if (cancelled_) return false;
  waits_.insert(ctx);
  return true;
}

void EtcdClient::Unregister(grpc::ClientContext* ctx) {
  MutexLock l(waits_mu_);
  waits_.erase(ctx);
}

bool EtcdClient::Cancelled() {
  MutexLock l(waits_mu_);
  return cancelled_;
}

Status EtcdClient::CancelledStatus(std::string_view key) const {
  return Status(StatusCode::kCancelled,
                What("Watch") + ": the wait for the deletion of '" + std::string(key) + "' was cancelled");
}

void EtcdClient::Cancel() {
  MutexLock l(waits_mu_);
  cancelled_ = true;
  // TryCancel only marks the call (gRPC ends it on its own threads): fine under the lock. A
  // context whose call has not started yet is cancelled when it starts.
  for (grpc::ClientContext* ctx : waits_) ctx->TryCancel();
}

StatusOr<bool> EtcdClient::WaitDeleted(std::string_view key, int64_t after_revision,
                                       int64_t timeout_ms) {
  if (Cancelled()) return CancelledStatus(key);
  const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto current = Get(key);
  if (!current.ok()) return current.status();
  if (!current->has_value()) return true;
  int64_t start = after_revision + 1;
  while (true) {
    grpc::ClientContext ctx;
    if (timeout_ms > 0) ctx.set_deadline(deadline);
    if (!Register(&ctx)) return CancelledStatus(key);
    int64_t compacted = 0;
    StatusOr<bool> deleted = WatchOnce(&ctx, key, start, &compacted);
    Unregister(&ctx);
    if (!deleted.ok() || compacted == 0) return deleted;
    // etcd compacted its history past `start`. The key is deleted since after_revision if it is
    // absent now or is a later incarnation; else it is the same one, still there at
    // `compacted`: watching from there misses nothing.
    current = Get(key);
    if (!current.ok()) return current.status();
    if (!current->has_value() || (*current)->create_revision > after_revision) return true;
    start = compacted;
  }
}

StatusOr<bool> EtcdClient::WatchOnce(grpc::ClientContext* ctx, std::string_view key,
                                     int64_t start_revision, int64_t* compacted) {
  // One member: a watch that fails is started again by the caller, on the member then current.
  Stubs& st = *stubs_[current_.load() % stubs_.size()];
  auto stream = st.watch->Watch(ctx);
  pb::WatchRequest req;
  req.mutable_create_request()->set_key(std::string(key));
  req.mutable_create_request()->set_start_revision(start_revision);
  bool deleted = false;
  std::string refused;  // why etcd cancelled the watch, when it did
  if (stream->Write(req)) {
    pb::WatchResponse rep;
    while (!deleted && refused.empty() && stream->Read(&rep)) {
      for (const pb::Event& ev : rep.events()) deleted = deleted || ev.type() == pb::Event::DELETE;
      if (rep.canceled() && !deleted) {
        *compacted = rep.compact_revision();
        refused = rep.cancel_reason().empty() ? "cancelled by etcd" : rep.cancel_reason();
      }
    }
  }
  // etcd keeps a watch stream open until its client leaves: end it (no effect when it ended).
  ctx->TryCancel();
  grpc::Status s = stream->Finish();
  if (deleted || *compacted > 0) return deleted;
  if (!refused.empty()) return Internal(What("Watch", st.endpoint) + " of '" + std::string(key) + "': " + refused);
  if (Cancelled()) return CancelledStatus(key);
  // Past the deadline etcd may end the stream first (then it is CANCELLED, not DEADLINE_EXCEEDED).
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
      (!s.ok() && std::chrono::system_clock::now() >= ctx->deadline())) {
    return false;
  }
  if (s.ok()) s = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the watch ended without an event");
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) current_.store((current_.load() + 1) % stubs_.size());
  return FromGrpc(s, What("Watch", st.endpoint));
}

// ------------------------------------------------------------------------------- URLs

StatusOr<EtcdUrl> ParseEtcdUrl(std::string_view url) {
  auto bad = [&](const std::string& why) -> Status {
    return InvalidArgument("bad etcd URL '" + std::string(url) + "': " + why +
                           " (expected etcd://host:port[,host:port...][/prefix])");
  };
  constexpr std::string_view kScheme = "etcd://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    auto sep = url.find("://");
    if (sep == std::string_view::npos) return bad("it does not start with etcd://");
    return bad("the scheme is " + std::string(url.substr(0, sep)) + ", not etcd");
  }
  if (url.find_first_of(" \t\r\n?#") != std::string_view::npos) {
    return bad("it contains a space, '?' or '#'");
  }
  std::string_view rest = url.substr(kScheme.size());
  size_t slash = rest.find('/');
  std::string_view members = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? "" : rest.substr(slash);
  if (members.empty()) return bad("no host");
  for (size_t start = 0; start <= members.size();) {
    size_t comma = std::min(members.find(',', start), members.size());
    std::string_view hostport = members.substr(start, comma - start);
    start = comma + 1;
    if (hostport.empty()) return bad("an empty member between commas");
    size_t colon = hostport.rfind(':');
    if (colon == std::string_view::npos || (hostport.back() == ']' && hostport.front() == '[')) {
      return bad("no port in '" + std::string(hostport) + "'");
    }
    std::string_view host = hostport.substr(0, colon), port = hostport.substr(colon + 1);
    if (host.empty()) return bad("no host in '" + std::string(hostport) + "'");
    bool bracketed = host.size() > 2 && host.front() == '[' && host.back() == ']';
    if (!bracketed && (host.find_first_of(":[]") != std::string_view::npos)) {
      return bad("host '" + std::string(host) + "' is not a name or address (an IPv6 address goes in [])");
    }
    int port_num = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), port_num);
    if (port.empty() || ec != std::errc() || end != port.data() + port.size() || port_num < 1 ||
        port_num > 65535) {
      return bad("port '" + std::string(port) + "' is not a number from 1 to 65535");
    }
  }
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  return EtcdUrl{std::string(members), path.empty() ? std::string("/torus") : std::string(path)};
}

}  // namespace torus
