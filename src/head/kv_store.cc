#include "head/kv_store.h"

#include "common/logging.h"

namespace torus {

namespace {
// The store's id of (ns, key): namespaces hold no NUL (they are names), keys may.
std::string StoreId(const std::string& ns, const std::string& key) {
  std::string id = ns;
  id.push_back('\0');
  id += key;
  return id;
}
}  // namespace

StatusOr<bool> KvStore::Put(const std::string& ns, const std::string& key, std::string value,
                            bool overwrite) {
  if (value.size() > kMaxValueBytes) {
    return Status(StatusCode::kInvalidArgument,
                  "KV value for key '" + key + "' is " + std::to_string(value.size()) +
                      " bytes; the limit is " + std::to_string(kMaxValueBytes) +
                      " (put large values in the object store)");
  }
  MutexLock lock(mu_);
  auto [it, added] = table_.try_emplace({ns, key});
  if (!added && !overwrite) return false;
  if (store_) {
    if (auto s = store_->Put(StoreKind::kKv, StoreId(ns, key), value); !s.ok()) {
      if (added) table_.erase(it);
      return s;
    }
  }
  bytes_ -= it->second.size();
  if (added) bytes_ += ns.size() + key.size();
  bytes_ += value.size();
  it->second = std::move(value);
  return added;
}

std::optional<std::string> KvStore::Get(const std::string& ns, const std::string& key) const {
  MutexLock lock(mu_);
  auto it = table_.find({ns, key});
  if (it == table_.end()) return std::nullopt;
  return it->second;
}

bool KvStore::Del(const std::string& ns, const std::string& key) {
  MutexLock lock(mu_);
  auto it = table_.find({ns, key});
  if (it == table_.end()) return false;
  if (store_) {
    if (auto s = store_->Delete(StoreKind::kKv, StoreId(ns, key)); !s.ok()) {
      TORUS_LOG(ERROR) << "KV key '" << key << "' not deleted from the head's state: " << s.message();
    }
  }
  bytes_ -= ns.size() + key.size() + it->second.size();
  table_.erase(it);
  return true;
}

std::vector<std::string> KvStore::Keys(const std::string& ns, const std::string& prefix) const {
  MutexLock lock(mu_);
  std::vector<std::string> out;
  for (auto it = table_.lower_bound({ns, prefix}); it != table_.end(); ++it) {
    if (it->first.first != ns || it->first.second.compare(0, prefix.size(), prefix) != 0) break;
    out.push_back(it->first.second);
  }
  return out;
}

size_t KvStore::Bytes() const {
  MutexLock lock(mu_);
  return bytes_;
}

StatusOr<size_t> KvStore::AttachStore(HeadStore* store) {
  auto records = store->LoadAll(StoreKind::kKv);
  if (!records.ok()) return records.status();
  MutexLock lock(mu_);
  store_ = store;
  for (auto& [id, value] : *records) {
    size_t nul = id.find('\0');
    if (nul == std::string::npos) continue;
    std::string ns = id.substr(0, nul), key = id.substr(nul + 1);
    bytes_ += ns.size() + key.size() + value.size();
    table_[{std::move(ns), std::move(key)}] = std::move(value);
  }
  return records->size();
}

}  // namespace torus
