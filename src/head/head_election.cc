#include "head/head_election.h"

#include <algorithm>

#include "common/logging.h"
#include "common/session.h"
#include "head/etcd_store.h"

namespace torus {

using Clock = std::chrono::steady_clock;

StatusOr<std::unique_ptr<HeadElection>> HeadElection::Connect(Config cfg) {
  auto url = ParseEtcdUrl(cfg.url);
  if (!url.ok()) return url.status();
  auto client = EtcdClient::Connect(url->endpoint);
  if (!client.ok()) return Unavailable("--state " + cfg.url + ": " + client.status().message());
  auto renew = EtcdClient::Connect(url->endpoint, std::max(100, cfg.ttl_s * 1000 / 4));
  if (!renew.ok()) return Unavailable("--state " + cfg.url + ": " + renew.status().message());
  std::unique_ptr<HeadElection> e(new HeadElection(std::move(cfg), url->prefix,
                                                   std::shared_ptr<EtcdClient>(std::move(*client)),
                                                   std::move(*renew)));
  if (auto s = e->NewLease(); !s.ok()) return s;
  e->ReadHeads(*e->client_);
  // Renew at a third of the TTL: two renewals may fail before the lease runs out.
  e->renewer_.Start(std::chrono::milliseconds(e->cfg_.ttl_s * 1000 / 3), [p = e.get()] { return p->Renew(); });
  return e;
}

HeadElection::HeadElection(Config cfg, std::string prefix, std::shared_ptr<EtcdClient> client,
                           std::unique_ptr<EtcdClient> renew_client)
    : cfg_(std::move(cfg)), prefix_(std::move(prefix)), client_(std::move(client)),
      renew_client_(std::move(renew_client)) {}

HeadElection::~HeadElection() { Stop(); }

Status HeadElection::NewLease() {
  const auto sent = Clock::now();
  auto lease = client_->GrantLease(cfg_.ttl_s);
  if (!lease.ok()) return lease.status();
  if (auto s = client_->Put(prefix_ + "/heads/" + cfg_.address, cfg_.address, *lease); !s.ok()) return s;
  MutexLock lock(mu_);
  lease_ = *lease;
  renewed_ = sent;
  return Status::Ok();
}

StatusOr<std::string> HeadElection::ClusterToken(const std::string& proposed) {
  auto kv = client_->CreateIfAbsent(prefix_ + "/token", proposed, /*lease=*/0);
  if (!kv.ok()) return kv.status();
  return CleanToken(kv->value, "etcd's key " + prefix_ + "/token");
}

StatusOr<std::string> HeadElection::ActiveNow() {
  auto kv = client_->Get(prefix_ + "/leader");
  if (!kv.ok()) return kv.status();
  return *kv ? (*kv)->value : std::string();
}

Status HeadElection::Campaign(const std::function<void(const std::string& active)>& on_standby) {
  const std::string key = prefix_ + "/leader";
  std::string seen;
  int failures = 0;
  for (;;) {
    int64_t lease;
    {
      MutexLock lock(mu_);
      if (stopped_) return Status(StatusCode::kCancelled, "the head is stopping");
      lease = lease_;
    }
    auto kv = client_->CreateIfAbsent(key, cfg_.address, lease);
    if (kv.ok() && kv->lease == lease && kv->value == cfg_.address) {
      {
        MutexLock lock(mu_);
        // Won on a lease the renewal thread has replaced meanwhile (it had expired): the key
        // goes with it; campaign again on the new one.
        if (lease_ != lease) continue;
        leader_revision_ = kv->create_revision;
      }
      TORUS_LOG(INFO) << "head " << cfg_.address << " is the active head (" << cfg_.url << ")";
      ReadHeads(*client_);
      return Status::Ok();
    }
    if (!kv.ok()) {
      if (++failures % 10 == 1) TORUS_LOG(WARNING) << "standing by: etcd: " << kv.status().message();
      // etcd refuses at once while unreachable: back off instead of spinning.
      MutexLock lock(mu_);
      if (!stopped_) stop_cv_.WaitFor(lock, std::chrono::milliseconds(std::min(100 * failures, 1000)));
      continue;
    } else {
      failures = 0;
      if (kv->value != seen) {
        seen = kv->value;
        TORUS_LOG(INFO) << "head " << cfg_.address << " stands by for the active head " << seen;
        on_standby(seen);
      }
    }
    // Wait for the leader key to go (its holder's lease ran out or was revoked). Bounded, so
    // that a lease of ours that expired meanwhile (etcd unreachable) is noticed by Renew.
    auto gone = client_->WaitDeleted(key, kv->mod_revision, 5000);
    if (!gone.ok() && gone.status().code() == StatusCode::kCancelled) {
      return Status(StatusCode::kCancelled, "the head is stopping");
    }
  }
}

StatusOr<std::unique_ptr<HeadStore>> HeadElection::OpenStore() {
  EtcdGuard guard;
  {
    MutexLock lock(mu_);
    guard = {prefix_ + "/leader", leader_revision_};
  }
  // A write refused by the fence means another head is active: stop at once.
  return EtcdHeadStore::Open(client_, cfg_.url, prefix_, guard,
                             [this](const Status& s) { LoseLeadership("a write was fenced: " + s.message()); });
}

void HeadElection::OnLost(std::function<void(const std::string& why)> on_lost) {
  std::string why;
  {
    MutexLock lock(mu_);
    on_lost_ = on_lost;
    if (!lost_) return;
    why = lost_why_;
  }
  on_lost(why);  // lost before anyone listened
}

void HeadElection::LoseLeadership(const std::string& why) {
  std::function<void(const std::string&)> on_lost;
  {
    MutexLock lock(mu_);
    if (lost_) return;
    lost_ = true;
    lost_why_ = why;
    on_lost = on_lost_;
  }
  TORUS_LOG(ERROR) << "head " << cfg_.address << " lost its leadership: " << why;
  if (on_lost) on_lost(why);
}

std::vector<std::string> HeadElection::Heads() const {
  MutexLock lock(mu_);
  return heads_;
}

void HeadElection::ReadHeads(EtcdClient& client) {
  auto kvs = client.GetPrefix(prefix_ + "/heads/");
  auto active = client.Get(prefix_ + "/leader");
  if (!kvs.ok() || !active.ok()) return;
  std::vector<std::string> heads;
  const std::string leader = *active ? (*active)->value : std::string();
  if (!leader.empty()) heads.push_back(leader);
  for (const auto& kv : *kvs) {
    if (kv.value != leader) heads.push_back(kv.value);
  }
  std::function<void(const std::vector<std::string>&)> on_heads;
  {
    MutexLock lock(mu_);
    if (heads == heads_) return;
    heads_ = heads;
    on_heads = on_heads_;
  }
  if (on_heads) on_heads(heads);
}

void HeadElection::OnHeads(std::function<void(const std::vector<std::string>&)> on_heads) {
  std::vector<std::string> now;
  {
    MutexLock lock(mu_);
    on_heads_ = on_heads;
    now = heads_;
  }
  on_heads(now);
}

std::optional<std::chrono::milliseconds> HeadElection::Renew() {
  const auto period = std::chrono::milliseconds(cfg_.ttl_s * 1000 / 3);
  const auto limit = std::chrono::milliseconds(cfg_.ttl_s * 1000 - kStepDownMs);
  int64_t lease;
  bool leading;
  Clock::time_point renewed;
  {
    MutexLock lock(mu_);
    if (stopped_ || lost_) return std::nullopt;
    lease = lease_;
    leading = leader_revision_ != 0;
    renewed = renewed_;
  }
  std::string why;
  if (leading && Clock::now() - renewed >= limit) {
    why = "no renewal of its etcd lease succeeded for " + std::to_string(limit.count()) + " ms";
  } else {
    const auto sent = Clock::now();
    // A leader's renewal may not outlast its step-down point: one sent just before it would
    // otherwise keep the head serving up to the client's timeout past it (and past the lease).
    auto by = std::chrono::system_clock::time_point::max();
    if (leading) {
      by = std::chrono::system_clock::now() +
           std::chrono::duration_cast<std::chrono::system_clock::duration>(renewed + limit - sent);
    }
    auto left = renew_client_->KeepAlive(lease, by);
    if (left.ok()) {
      {
        MutexLock lock(mu_);
        renewed_ = sent;
      }
      ReadHeads(*renew_client_);
      // The next renewal a period after this one was sent, however long the list took.
      const auto next = std::chrono::duration_cast<std::chrono::milliseconds>(sent + period - Clock::now());
      return std::clamp(next, std::chrono::milliseconds(1), period);
    }
    if (left.status().code() == StatusCode::kNotFound) {
      why = "its etcd lease expired";
      MutexLock lock(mu_);
      leading = leader_revision_ != 0;  // the campaign may have won on it meanwhile
    } else if (leading) {
      // Try again before the step-down point: the last chance to keep the leadership.
      auto left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(renewed + limit - Clock::now());
      if (++renew_failures_ % 5 == 1) {
        TORUS_LOG(WARNING) << "head " << cfg_.address << ": renewing its etcd lease: " << left.status().message();
      }
      return std::clamp(left_ms, std::chrono::milliseconds(1), period);
    } else {
      return period;  // a standby keeps trying; its lease is only for the heads' list
    }
  }
  if (!leading) {
    // A standby only needs a lease again: it announces itself anew.
    TORUS_LOG(WARNING) << "standby head " << cfg_.address << ": " << why << "; taking a new lease";
    (void)NewLease();
    return period;
  }
  LoseLeadership(why);
  return std::nullopt;
}

void HeadElection::Stop() {
  int64_t lease;
  {
    MutexLock lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    lease = lease_;
    stop_cv_.NotifyAll();
  }
  client_->Cancel();
  renewer_.Stop();
  (void)renew_client_->RevokeLease(lease);  // the leader key and heads/<us> go now
}

}  // namespace torus
