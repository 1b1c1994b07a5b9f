// HeadElection: one active head among several that share one etcd (`torus start --head --state
// etcd://HOST:PORT[/prefix]`, docs/fault_tolerance.md "Standby heads").
//
// Keys, under the URL's prefix:
//   <prefix>/leader          the active head's address, bound to its lease (gone when it dies)
//   <prefix>/heads/<address> every head, active or standing by, bound to its own lease
//   <prefix>/token           the cluster token, written once by the first head
//   <prefix>/state/...       the durable records (head/etcd_store.h)
// Each head holds one lease of ttl_s seconds and renews it every third of that (each renewal
// may take a quarter of the TTL, and an active head's never runs past its step-down point). The first head to create the leader key is active; the others
// stand by, waiting (etcd's watch) for the key to go. An active head whose last successful
// renewal was *sent* kStepDownMs before the TTL runs out ago has lost its leadership: on_lost
// runs and the process must stop serving (the daemon exits). It steps down before etcd can
// expire its lease (a renewal takes effect in etcd after it was sent), so two heads never
// serve at once; its writes are fenced besides (the store's guard is the leader key's create
// revision).
//
// THREADS: Campaign blocks its caller; one owned thread (a PeriodicThread) renews the lease and
// re-reads the list of heads, from Connect until Stop/destruction; on_lost runs on it. Heads()
// and active() may be called from any thread (mu_).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/periodic_thread.h"
#include "common/thread_annotations.h"
#include "head/etcd_client.h"
#include "head/head_store.h"

namespace torus {

class HeadElection {
 public:
  struct Config {
    std::string url;      // etcd://host:port[/prefix]
    std::string address;  // this head's "host:port", as clients dial it
    int ttl_s = 2;        // the lease; etcd may raise it to its minimum
  };
  // Connects, takes a lease and announces this head under heads/.
  static StatusOr<std::unique_ptr<HeadElection>> Connect(Config cfg);
  ~HeadElection();
  HeadElection(const HeadElection&) = delete;
  HeadElection& operator=(const HeadElection&) = delete;

  // The cluster token in etcd (through CleanToken), or `proposed` once written there by the
  // first head to ask.
  StatusOr<std::string> ClusterToken(const std::string& proposed);
  // The active head's address now ("" when none).
  StatusOr<std::string> ActiveNow();

  // Blocks until this head is the active one (OK) or Stop (kCancelled). While another head is
  // active, on_standby(its address) runs each time a different one is seen.
  Status Campaign(const std::function<void(const std::string& active)>& on_standby) EXCLUDES(mu_);
  // After a successful Campaign: the durable state, fenced by the leader key.
  StatusOr<std::unique_ptr<HeadStore>> OpenStore();
  // After a successful Campaign: on_lost(why) runs once when the leadership is lost (the lease
  // ran out, or a write was fenced: another head is active), on the thread that found it; at
  // once if it was lost already.
  void OnLost(std::function<void(const std::string& why)> on_lost) EXCLUDES(mu_);
  // The heads alive (the active first), as last read (every renewal).
  std::vector<std::string> Heads() const EXCLUDES(mu_);
  // on_heads(list) runs now and (on the renewal thread) whenever the list read changes.
  void OnHeads(std::function<void(const std::vector<std::string>&)> on_heads) EXCLUDES(mu_);
  // Gives the leadership up at once (revokes the lease: a standby takes over without waiting
  // for the TTL) and ends Campaign and the renewal thread.
  void Stop();

 private:
  HeadElection(Config cfg, std::string prefix, std::shared_ptr<EtcdClient> client,
               std::unique_ptr<EtcdClient> renew_client);
  // How long before the TTL an active head without a renewal steps down.
  static constexpr int kStepDownMs = 500;
  Status NewLease() EXCLUDES(mu_);
  std::optional<std::chrono::milliseconds> Renew() EXCLUDES(mu_);
  // Once: marks the leadership lost and runs on_lost (if set yet; else OnLost runs it).
  void LoseLeadership(const std::string& why) EXCLUDES(mu_);
  void ReadHeads(EtcdClient& client) EXCLUDES(mu_);

  // constant after construction
  const Config cfg_;
  const std::string prefix_;
  const std::shared_ptr<EtcdClient> client_;
  const std::unique_ptr<EtcdClient> renew_client_;  // renewals only: a deadline of ttl/4

  mutable Mutex mu_;
  int64_t lease_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point renewed_ GUARDED_BY(mu_);  // when the last good renewal was sent
  int64_t leader_revision_ GUARDED_BY(mu_) = 0;  // the leader key's create revision while active
  bool lost_ GUARDED_BY(mu_) = false;
  std::string lost_why_ GUARDED_BY(mu_);
  CondVar stop_cv_;  // stopped_ set (ends a campaign's back-off)
  int renew_failures_ = 0;  // the renewal thread's only
  bool stopped_ GUARDED_BY(mu_) = false;
  std::function<void(const std::string&)> on_lost_ GUARDED_BY(mu_);
  std::vector<std::string> heads_ GUARDED_BY(mu_);
  std::function<void(const std::vector<std::string>&)> on_heads_ GUARDED_BY(mu_);
  PeriodicThread renewer_;
};

}  // namespace torus
