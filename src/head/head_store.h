// HeadStore: where the head keeps its durable state (docs/fault_tolerance.md). Every record is
// bytes under (kind, id): a serialised protobuf record (an actor, a placement group, a job) or a
// KV value. Each Put/Delete is durable when it returns, so a change the head acknowledges after
// writing it survives a kill -9 of the head.
//
// Two implementations:
//  - SqliteHeadStore (head/sqlite_store.h): a file in the session directory, the default;
//  - EtcdHeadStore (head/etcd_store.h): the same records in etcd, shared by an active head and
//    its standbys (head/head_election.h); its writes are fenced by the active head's leader key.
//
// THREADS: every method may be called from any thread. Methods return errors as Status; a failed
// write is logged by the caller, which keeps serving from memory (the state is then only as
// durable as the last successful write).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace torus {

enum class StoreKind {
  kMeta = 0,            // the store's own facts (session, format version)
  kKv = 1,              // id: namespace + '\0' + key
  kActor = 2,           // rpc::ActorRecord + its creation spec (head/actors.cc)
  kPlacementGroup = 3,  // rpc::PlacementGroupRecord
  kDriverJob = 4,       // rpc::JobRequest of a connected driver
  kJob = 5,             // rpc::JobRecord of a submitted job (head/jobs.cc)
};
inline constexpr StoreKind kRecordKinds[] = {StoreKind::kKv, StoreKind::kActor, StoreKind::kPlacementGroup,
                                             StoreKind::kDriverJob, StoreKind::kJob};

class HeadStore {
 public:
  virtual ~HeadStore() = default;

  // Opens the state `state` names: "etcd://host:port[/prefix]" (unfenced: for reading, or for
  // a head without standbys) or the path of an SQLite file (created if absent). A store of
  // another format, or a damaged one, is refused whole.
  static StatusOr<std::unique_ptr<HeadStore>> Open(const std::string& state);
  static bool IsEtcd(std::string_view state) { return state.substr(0, 7) == "etcd://"; }
  // The SQLite file of a session directory.
  static std::string PathIn(const std::string& session_dir);

  virtual Status Put(StoreKind kind, std::string_view id, std::string_view value) = 0;
  virtual Status Delete(StoreKind kind, std::string_view id) = 0;
  // Every record of `kind`, by id in byte order.
  virtual StatusOr<std::vector<std::pair<std::string, std::string>>> LoadAll(StoreKind kind) = 0;
  // How many records of `kind` there are (what a resumed head takes over).
  virtual StatusOr<size_t> Count(StoreKind kind) = 0;
  // What the store is, for messages: the file's path or the etcd URL.
  virtual const std::string& path() const = 0;

 protected:
  // The records' format (kMeta "format"): a new store gets kFormat; a store of another format,
  // or an unmarked one with records, is refused. Implementations call it once opened.
  static constexpr const char* kFormat = "1";
  Status CheckFormat();
};

}  // namespace torus
