// SqliteHeadStore: the head's durable state (head/head_store.h) on local disk, an SQLite database
// in WAL mode at <session dir>/head_state.sqlite3. Each Put/Delete is its own transaction,
// committed before it returns (synchronous=NORMAL: the WAL is written by the commit and synced
// at checkpoints, which loses nothing when a process dies; a power cut may lose the last
// commits, which a head restarted on another machine could not use anyway).
//
// Why SQLite: Debian ships it (libsqlite3), it is the most exercised embedded store there is,
// and WAL gives one writer with readers never blocked, which is all one head needs. LMDB would
// do as well; SQLite's single file is easier to inspect (`sqlite3 head_state.sqlite3`).
//
// THREADS: every method may be called from any thread; one mutex serialises the statements.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/thread_annotations.h"
#include "head/head_store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace torus {

class SqliteHeadStore final : public HeadStore {
 public:
  // Opens (creating if absent) the database at `path`.
  static StatusOr<std::unique_ptr<HeadStore>> Open(const std::string& path);
  ~SqliteHeadStore() override;
  SqliteHeadStore(const SqliteHeadStore&) = delete;
  SqliteHeadStore& operator=(const SqliteHeadStore&) = delete;

  Status Put(StoreKind kind, std::string_view id, std::string_view value) override EXCLUDES(mu_);
  Status Delete(StoreKind kind, std::string_view id) override EXCLUDES(mu_);
  StatusOr<std::vector<std::pair<std::string, std::string>>> LoadAll(StoreKind kind) override EXCLUDES(mu_);
  StatusOr<size_t> Count(StoreKind kind) override EXCLUDES(mu_);
  const std::string& path() const override { return path_; }

 private:
  SqliteHeadStore(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}
  Status Prepare() EXCLUDES(mu_);
  // SQLite's message when the last failed statement met a damaged file (SQLITE_CORRUPT).
  std::optional<std::string> CorruptMessage() EXCLUDES(mu_);
  Status Error(const char* what) const REQUIRES(mu_);

  const std::string path_;
  Mutex mu_;
  sqlite3* db_ GUARDED_BY(mu_);
  sqlite3_stmt* put_ GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* del_ GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* load_ GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* count_ GUARDED_BY(mu_) = nullptr;
};

}  // namespace torus
