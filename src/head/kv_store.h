// The cluster's small key-value store (Ray's "internal KV"): what Python drivers export
// (pickled functions and actor classes, fetched once by each worker), and user keys. Keys are
// bytes inside a namespace; values are bytes. With a store attached (a head with a session
// directory) every change is written to it before the call returns (head/head_store.h).
//
// THREADS: every method may be called from any thread; one mutex guards the table.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "head/head_store.h"

namespace torus {

class KvStore {
 public:
  // Largest value accepted: a bigger one belongs in the object store.
  static constexpr size_t kMaxValueBytes = 64u << 20;

  // Stores `value` under (ns, key). Without overwrite an existing value is kept. Returns whether
  // the key is new, or InvalidArgument for a value over kMaxValueBytes.
  StatusOr<bool> Put(const std::string& ns, const std::string& key, std::string value,
                     bool overwrite) EXCLUDES(mu_);
  std::optional<std::string> Get(const std::string& ns, const std::string& key) const EXCLUDES(mu_);
  // Whether the key existed.
  bool Del(const std::string& ns, const std::string& key) EXCLUDES(mu_);
  // Keys of `ns` starting with `prefix`, in byte order.
  std::vector<std::string> Keys(const std::string& ns, const std::string& prefix) const EXCLUDES(mu_);
  size_t Bytes() const EXCLUDES(mu_);
  // Attaches the durable store and loads what it holds (a resumed head); returns how many keys.
  // Once, before serving.
  StatusOr<size_t> AttachStore(HeadStore* store) EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::map<std::pair<std::string, std::string>, std::string> table_ GUARDED_BY(mu_);
  size_t bytes_ GUARDED_BY(mu_) = 0;
  HeadStore* store_ GUARDED_BY(mu_) = nullptr;
};

}  // namespace torus
