#include "head/etcd_store.h"

namespace torus {

StatusOr<std::unique_ptr<HeadStore>> EtcdHeadStore::Open(const std::string& url, const EtcdGuard& guard) {
  auto parsed = ParseEtcdUrl(url);
  if (!parsed.ok()) return parsed.status();
  auto client = EtcdClient::Connect(parsed->endpoint);
  if (!client.ok()) return Unavailable("the head's state " + url + ": " + client.status().message());
  return Open(std::shared_ptr<EtcdClient>(std::move(*client)), url, parsed->prefix, guard);
}

StatusOr<std::unique_ptr<HeadStore>> EtcdHeadStore::Open(std::shared_ptr<EtcdClient> client, const std::string& url,
                                                         const std::string& prefix, const EtcdGuard& guard,
                                                         std::function<void(const Status&)> on_fenced) {
  std::unique_ptr<EtcdHeadStore> s(new EtcdHeadStore(std::move(client), url, prefix, guard, std::move(on_fenced)));
  if (auto st = s->CheckFormat(); !st.ok()) return st;
  return std::unique_ptr<HeadStore>(std::move(s));
}

std::string EtcdHeadStore::KindPrefix(StoreKind kind) const {
  return prefix_ + "/state/" + std::to_string(static_cast<int>(kind)) + "/";
}

Status EtcdHeadStore::Fenced(Status s) const {
  if (s.code() == StatusCode::kFailedPrecondition && on_fenced_) on_fenced_(s);
  return s;
}

Status EtcdHeadStore::Put(StoreKind kind, std::string_view id, std::string_view value) {
  std::string key = KindPrefix(kind);
  key.append(id);
  if (key.size() + value.size() > kMaxRecordBytes) {
    return InvalidArgument("a record of " + std::to_string(value.size()) + " bytes is larger than " + url_ +
                           " takes in one request (etcd's --max-request-bytes, 1.5 MiB by default)");
  }
  return Fenced(client_->Put(key, value, /*lease=*/0, guard_));
}

Status EtcdHeadStore::Delete(StoreKind kind, std::string_view id) {
  std::string key = KindPrefix(kind);
  key.append(id);
  return Fenced(client_->Delete(key, guard_));
}

StatusOr<std::vector<std::pair<std::string, std::string>>> EtcdHeadStore::LoadAll(StoreKind kind) {
  const std::string p = KindPrefix(kind);
  auto kvs = client_->GetPrefix(p);
  if (!kvs.ok()) return kvs.status();
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(kvs->size());
  for (auto& kv : *kvs) out.emplace_back(kv.key.substr(p.size()), std::move(kv.value));
  return out;
}

StatusOr<size_t> EtcdHeadStore::Count(StoreKind kind) {
  auto n = client_->CountPrefix(KindPrefix(kind));
  if (!n.ok()) return n.status();
  return static_cast<size_t>(*n);
}

}  // namespace torus
