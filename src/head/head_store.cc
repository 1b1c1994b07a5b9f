#include "head/head_store.h"

#include "head/etcd_store.h"
#include "head/sqlite_store.h"

namespace torus {

StatusOr<std::unique_ptr<HeadStore>> HeadStore::Open(const std::string& state) {
  if (IsEtcd(state)) return EtcdHeadStore::Open(state, EtcdGuard{});
  return SqliteHeadStore::Open(state);
}

std::string HeadStore::PathIn(const std::string& session_dir) {
  return session_dir + "/head_state.sqlite3";
}

Status HeadStore::CheckFormat() {
  auto meta = LoadAll(StoreKind::kMeta);
  if (!meta.ok()) return meta.status();
  for (const auto& [k, v] : *meta) {
    if (k != "format") continue;
    if (v == kFormat) return Status::Ok();
    return FailedPrecondition("the head's state " + path() + " has format " + v + ", this torus reads " + kFormat +
                              "; refusing to load it (start afresh with --new-session)");
  }
  for (StoreKind k : kRecordKinds) {
    auto n = Count(k);
    if (!n.ok()) return n.status();
    if (*n) {
      return FailedPrecondition("the head's state " + path() +
                                " has no format mark (written by an older torus); refusing to load it "
                                "(start afresh with --new-session)");
    }
  }
  return Put(StoreKind::kMeta, "format", kFormat);
}

}  // namespace torus
