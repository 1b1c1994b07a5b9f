#include "head/head_election.h"

#include <algorithm>

#include "common/logging.h"
#include "head/etcd_store.h"

namespace torus {

using Clock = std::chrono::steady_clock;

StatusOr<std::unique_ptr<HeadElection>> HeadElection::Connect(Config cfg) {
  auto url = ParseEtcdUrl(cfg.url);
  if (!url.ok()) return url.status();
  auto client = EtcdClient::Connect(url->endpoint);
  if (!client.ok()) return Unavailable("--state " + cfg.url + ": " + client.status().message());
  std::unique_ptr<HeadElection> e(
      new HeadElection(std::move(cfg), url->prefix, std::shared_ptr<EtcdClient>(std::move(*client))));
  if (auto s = e->NewLease(); !s.ok()) return s;
  e->ReadHeads();
  // Renew at a third of the TTL: two renewals may fail before the lease runs out.
  e->renewer_.Start(std::chrono::milliseconds(e->cfg_.ttl_s * 1000 / 3), [p = e.get()] { return p->Renew(); });
  return e;
}

HeadElection::HeadElection(Config cfg, std::string prefix, std::shared_ptr<EtcdClient> client)
    : cfg_(std::move(cfg)), prefix_(std::move(prefix)), client_(std::move(client)) {}

HeadElection::~HeadElection() { Stop(); }

Status HeadElection::NewLease() {
  auto lease = client_->GrantLease(cfg_.ttl_s);
  if (!lease.ok()) return lease.status();
  if (auto s = client_->Put(prefix_ + "/heads/" + cfg_.address, cfg_.address, *lease); !s.ok()) return s;
  MutexLock lock(mu_);
  lease_ = *lease;
  renewed_ = Clock::now();
  return Status::Ok();
}

StatusOr<std::string> HeadElection::ClusterToken(const std::string& proposed) {
  auto kv = client_->CreateIfAbsent(prefix_ + "/token", proposed, /*lease=*/0);
  if (!kv.ok()) return kv.status();
  return kv->value;
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
        leader_revision_ = kv->create_revision;
      }
      TORUS_LOG(INFO) << "head " << cfg_.address << " is the active head (" << cfg_.url << ")";
      ReadHeads();
      return Status::Ok();
    }
    if (!kv.ok()) {
      if (++failures % 10 == 1) TORUS_LOG(WARNING) << "standing by: etcd: " << kv.status().message();
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
    auto gone = client_->WaitDeleted(key, kv.ok() ? kv->mod_revision : 0, failures ? 500 : 5000);
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
  return EtcdHeadStore::Open(client_, cfg_.url, prefix_, guard);
}

void HeadElection::OnLost(std::function<void(const std::string& why)> on_lost) {
  MutexLock lock(mu_);
  on_lost_ = std::move(on_lost);
}

std::vector<std::string> HeadElection::Heads() const {
  MutexLock lock(mu_);
  return heads_;
}

void HeadElection::ReadHeads() {
  auto kvs = client_->GetPrefix(prefix_ + "/heads/");
  auto active = ActiveNow();
  if (!kvs.ok() || !active.ok()) return;
  std::vector<std::string> heads;
  if (!active->empty()) heads.push_back(*active);
  for (const auto& kv : *kvs) {
    if (kv.value != *active) heads.push_back(kv.value);
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
  int64_t lease;
  bool leading;
  {
    MutexLock lock(mu_);
    if (stopped_ || lost_) return std::nullopt;
    lease = lease_;
    leading = leader_revision_ != 0;
  }
  auto left = client_->KeepAlive(lease);
  std::string why;
  {
    MutexLock lock(mu_);
    if (left.ok()) {
      renewed_ = Clock::now();
    } else if (left.status().code() == StatusCode::kNotFound) {
      why = "its etcd lease expired";
    } else if (Clock::now() - renewed_ >= std::chrono::seconds(cfg_.ttl_s)) {
      why = "etcd did not renew its lease for " + std::to_string(cfg_.ttl_s) + " s: " + left.status().message();
    }
  }
  if (why.empty()) {
    ReadHeads();
    return period;
  }
  if (!leading) {
    // A standby only needs a lease again: it announces itself anew.
    TORUS_LOG(WARNING) << "standby head " << cfg_.address << ": " << why << "; taking a new lease";
    (void)NewLease();
    return period;
  }
  std::function<void(const std::string&)> on_lost;
  {
    MutexLock lock(mu_);
    lost_ = true;
    on_lost = on_lost_;
  }
  TORUS_LOG(ERROR) << "head " << cfg_.address << " lost its leadership: " << why;
  if (on_lost) on_lost(why);
  return std::nullopt;
}

void HeadElection::Stop() {
  int64_t lease;
  {
    MutexLock lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    lease = lease_;
  }
  client_->Cancel();
  renewer_.Stop();
  (void)client_->RevokeLease(lease);  // the leader key and heads/<us> go now
}

}  // namespace torus
