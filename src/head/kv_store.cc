#include "head/kv_store.h"

namespace torus {

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

}  // namespace torus
