// EtcdClient: the few calls of etcd's v3 API (gRPC, proto/etcd.proto) the head needs to keep its
// durable state in etcd and to elect one active head among several (docs/fault_tolerance.md,
// "Standby heads on etcd"): reads by key and by prefix, writes that may be fenced by a guard key,
// create-if-absent bound to a lease, leases (grant, keep alive, revoke), and a wait for a key's
// deletion (etcd's Watch).
//
// Fencing: a write given an EtcdGuard is one etcd transaction that applies only while the guard
// key still exists with the create revision the guard names (the active head's leader key): a
// head that lost its lease cannot overwrite its successor's state. Such a write whose guard no
// longer holds fails with kFailedPrecondition.
//
// Errors: every call returns Status/StatusOr; an unreachable etcd is kUnavailable naming the
// endpoint; a call gives up after the client's timeout (Connect's timeout_ms), kDeadlineExceeded.
//
// THREADS: every method may be called from any thread, concurrently (the gRPC stubs are
// thread-safe; the client holds no lock during a call). WaitDeleted blocks its caller; Cancel (from any thread)
// ends every WaitDeleted in flight, which then return kCancelled.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace grpc {
class Channel;
class ClientContext;
class Status;
}  // namespace grpc
namespace etcdserverpb {
class TxnRequest;
class TxnResponse;
}  // namespace etcdserverpb

namespace torus {

struct EtcdKv {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

// A write applies only while `key` exists with this create revision. An empty key guards nothing.
struct EtcdGuard {
  std::string key;
  int64_t create_revision = 0;
};

class EtcdClient {
 public:
  // `endpoint` is "host:port" of etcd's client URL, or several members' separated by commas
  // (a call goes to the member that last answered, and on to the next while one cannot be
  // reached or does not answer in time). Checks that etcd answers (one read) within timeout_ms, which is also every later
  // call's deadline (per member tried).
  static StatusOr<std::unique_ptr<EtcdClient>> Connect(const std::string& endpoint, int timeout_ms = 5000);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const std::string& endpoint() const { return endpoint_; }

  // The key's current value (nullopt if absent).
  StatusOr<std::optional<EtcdKv>> Get(std::string_view key);
  // Every key starting with `prefix`, in byte order (all of them: paged internally).
  StatusOr<std::vector<EtcdKv>> GetPrefix(std::string_view prefix);
  // How many keys start with `prefix`.
  StatusOr<int64_t> CountPrefix(std::string_view prefix);

  // Writes key = value (bound to `lease` when non-zero).
  Status Put(std::string_view key, std::string_view value, int64_t lease = 0, const EtcdGuard& guard = {});
  // Deletes `key` (absent is fine).
  Status Delete(std::string_view key, const EtcdGuard& guard = {});
  // Creates key = value bound to `lease` when the key does not exist. Returns the key as it is
  // after the call: ours (create_revision set, value == `value`, lease == `lease`) when created,
  // otherwise the holder's.
  StatusOr<EtcdKv> CreateIfAbsent(std::string_view key, std::string_view value, int64_t lease);

  // A new lease of `ttl_s` seconds (etcd may raise it to its minimum); returns its id.
  StatusOr<int64_t> GrantLease(int64_t ttl_s);
  // Renews the lease once; returns the seconds it has left, or kNotFound when it has expired.
  // Gives up (kDeadlineExceeded) at `by` if that comes before the client's timeout, whichever
  // members are left to try: a leader must know whether it still leads by a point in time.
  StatusOr<int64_t> KeepAlive(int64_t lease,
                              std::chrono::system_clock::time_point by = std::chrono::system_clock::time_point::max());
  Status RevokeLease(int64_t lease);

  // Blocks until `key` is deleted at a revision after `after_revision` (or is already absent),
  // up to timeout_ms (0: no limit). Returns true when deleted, false on timeout.
  StatusOr<bool> WaitDeleted(std::string_view key, int64_t after_revision, int64_t timeout_ms);
  // Ends every WaitDeleted in flight and every later one (kCancelled).
  void Cancel();

 private:
  struct Stubs;
  EtcdClient(std::string endpoint, int timeout_ms);
  // A context whose deadline is timeout_ms from now, or `by` when that is sooner.
  std::unique_ptr<grpc::ClientContext> Context(
      std::chrono::system_clock::time_point by = std::chrono::system_clock::time_point::max()) const;
  // "etcd at <endpoint> (<call>)", the start of every error message (`used`: the member asked
  // last; empty: the whole list).
  std::string What(const char* call, const std::string& used = "") const;
  // Runs `call` on the current member; while a member cannot be reached or does not answer in
  // time, on the next one, each once; the first that answers becomes current. *used: the last
  // one asked.
  grpc::Status OnAny(const std::function<grpc::Status(Stubs&)>& call, std::string* used);
  // A fenced write: `req` with `guard`'s compare (empty guard: none); kFailedPrecondition when
  // the guard no longer holds.
  Status Commit(etcdserverpb::TxnRequest& req, const EtcdGuard& guard, const char* call);
  Status Txn(const etcdserverpb::TxnRequest& req, etcdserverpb::TxnResponse* rep, const char* call);
  // One watch of `key` from `start_revision` on `ctx` (registered): true on a deletion, false
  // on timeout; *compacted is set (> 0) when etcd no longer has the history from there.
  StatusOr<bool> WatchOnce(grpc::ClientContext* ctx, std::string_view key, int64_t start_revision,
                           int64_t* compacted);
  bool Register(grpc::ClientContext* ctx) EXCLUDES(waits_mu_);  // false once cancelled
  void Unregister(grpc::ClientContext* ctx) EXCLUDES(waits_mu_);
  bool Cancelled() EXCLUDES(waits_mu_);
  Status CancelledStatus(std::string_view key) const;

  const std::string endpoint_;  // "host:port[,host:port...]"
  const int timeout_ms_;
  std::vector<std::unique_ptr<Stubs>> stubs_;  // one per member, in the order given
  std::atomic<size_t> current_{0};            // the member calls go to first
  Mutex waits_mu_;
  bool cancelled_ GUARDED_BY(waits_mu_) = false;
  std::set<grpc::ClientContext*> waits_ GUARDED_BY(waits_mu_);  // WaitDeleted calls in flight
};

// Parses "etcd://host:port[,host:port...][/prefix]" (the head's --state flag): endpoint
// "host:port[,host:port...]" (the members, for EtcdClient::Connect) and the key
// prefix every key of this cluster goes under ("/torus" when none is given; always starting with
// '/' and without a trailing '/').
struct EtcdUrl {
  std::string endpoint;
  std::string prefix;
};
StatusOr<EtcdUrl> ParseEtcdUrl(std::string_view url);

}  // namespace torus
