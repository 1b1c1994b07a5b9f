// EtcdHeadStore: the head's durable state (head/head_store.h) in etcd, so that a standby head
// on another machine can take it over (head/head_election.h, docs/fault_tolerance.md). A record
// (kind, id) is the key <prefix>/state/<kind>/<id>; each Put/Delete is one etcd request, durable
// (etcd's raft log) when it returns.
//
// Fenced: a store opened with a guard (the active head's leader key and its create revision)
// writes only while that key is unchanged, so a head that lost its leadership while a write was
// on its way cannot overwrite what its successor wrote; such a write fails (kFailedPrecondition).
// Reads are never fenced.
//
// THREADS: every method may be called from any thread (EtcdClient is thread-safe; no lock here).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "head/etcd_client.h"
#include "head/head_store.h"

namespace torus {

class EtcdHeadStore final : public HeadStore {
 public:
  // Connects to the etcd `url` names ("etcd://host:port[/prefix]").
  static StatusOr<std::unique_ptr<HeadStore>> Open(const std::string& url, const EtcdGuard& guard);
  // On a connected client: the keys go under `prefix`.
  // `on_fenced` runs when a write is refused by the guard (another head is active).
  static StatusOr<std::unique_ptr<HeadStore>> Open(std::shared_ptr<EtcdClient> client, const std::string& url,
                                                   const std::string& prefix, const EtcdGuard& guard,
                                                   std::function<void(const Status&)> on_fenced = nullptr);
  // etcd refuses requests over --max-request-bytes (1.5 MiB by default); a record larger than
  // this is refused here, naming its size, before it is sent.
  static constexpr size_t kMaxRecordBytes = (3u << 19) - (16u << 10);

  Status Put(StoreKind kind, std::string_view id, std::string_view value) override;
  Status Delete(StoreKind kind, std::string_view id) override;
  StatusOr<std::vector<std::pair<std::string, std::string>>> LoadAll(StoreKind kind) override;
  StatusOr<size_t> Count(StoreKind kind) override;
  const std::string& path() const override { return url_; }

 private:
  EtcdHeadStore(std::shared_ptr<EtcdClient> client, std::string url, std::string prefix, EtcdGuard guard,
                std::function<void(const Status&)> on_fenced)
      : client_(std::move(client)), url_(std::move(url)), prefix_(std::move(prefix)), guard_(std::move(guard)),
        on_fenced_(std::move(on_fenced)) {}
  std::string KindPrefix(StoreKind kind) const;
  Status Fenced(Status s) const;

  // constant after construction
  const std::shared_ptr<EtcdClient> client_;
  const std::string url_;
  const std::string prefix_;
  const EtcdGuard guard_;
  const std::function<void(const Status&)> on_fenced_;
};

}  // namespace torus
