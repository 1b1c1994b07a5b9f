#include "head/sqlite_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <cerrno>

namespace torus {

namespace {
constexpr const char* kSchema =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "CREATE TABLE IF NOT EXISTS records ("
    "  kind INTEGER NOT NULL, id BLOB NOT NULL, value BLOB NOT NULL, PRIMARY KEY (kind, id)"
    ") WITHOUT ROWID;";

Status Bind(sqlite3* db, sqlite3_stmt* st, int index, std::string_view bytes) {
  // SQLITE_STATIC: the statement runs to completion before `bytes` can go away.
  if (sqlite3_bind_blob64(st, index, bytes.data(), bytes.size(), SQLITE_STATIC) != SQLITE_OK) {
    return Internal(std::string("head state: binding a value: ") + sqlite3_errmsg(db));
  }
  return Status();
}

// Why the file at `path` cannot be a state torus wrote although SQLite would open it, or "".
// SQLite reads an empty (or absent) file as a new database and deletes the write-ahead log
// beside it, which may hold every record: the session would start afresh without a word. A
// state torus wrote is never empty (switching it to WAL writes its first page).
std::string MissingDatabase(const std::string& path) {
  struct stat db, wal;
  const bool has_db = stat(path.c_str(), &db) == 0;
  const bool has_wal = stat((path + "-wal").c_str(), &wal) == 0 && wal.st_size > 0;
  if (has_db && db.st_size == 0) {
    return has_wal ? "the file is empty, beside a write-ahead log of " + std::to_string(wal.st_size) + " bytes"
                   : "the file is empty";
  }
  if (!has_db && has_wal) return "the file is missing, but its write-ahead log " + path + "-wal is there";
  return "";
}

// "no space left on device writing PATH" when the last failure of `db` was a full disk, else "".
std::string FullDisk(sqlite3* db, const std::string& path) {
  const int e = sqlite3_system_errno(db);
  if ((sqlite3_errcode(db) & 0xff) == SQLITE_FULL || e == ENOSPC || e == EDQUOT) {
    return "no space left on device writing " + path;
  }
  return "";
}
}  // namespace

StatusOr<std::unique_ptr<HeadStore>> SqliteHeadStore::Open(const std::string& path) {
  if (std::string why = MissingDatabase(path); !why.empty()) {
    return Unavailable("the head's state " + path + " is damaged (" + why + "); refusing to load it");
  }
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string why = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return Unavailable("cannot open the head's state " + path + ": " + why);
  }
  sqlite3_busy_timeout(db, 5000);
  // A damaged file is refused whole, never half loaded. Where SQLite meets the damage depends on
  // where the file was cut or overwritten (setting the schema up, the check, preparing the
  // statements): each says the same.
  auto damaged = [&path](const std::string& why) {
    return Unavailable("the head's state " + path + " is damaged (" + why + "); refusing to load it");
  };
  auto corrupt = [db] { return (sqlite3_errcode(db) & 0xff) == SQLITE_CORRUPT; };
  char* err = nullptr;
  if (sqlite3_exec(db, kSchema, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string why = err ? err : "unknown error";
    bool is_corrupt = corrupt();
    std::string full = FullDisk(db, path);
    sqlite3_free(err);
    sqlite3_close(db);
    if (is_corrupt) return damaged(why);
    if (!full.empty()) {
      return Status(StatusCode::kResourceExhausted, "cannot set up the head's state " + path + ": " + full);
    }
    return Unavailable("cannot set up the head's state " + path + ": " + why +
                       " (is it an SQLite database written by torus?)");
  }
  std::string check;
  auto row = [](void* out, int, char** values, char**) {
    if (values[0]) *static_cast<std::string*>(out) += values[0];
    return 0;
  };
  if (sqlite3_exec(db, "PRAGMA quick_check;", row, &check, &err) != SQLITE_OK || check != "ok") {
    std::string why = err ? err : check;
    std::string full = FullDisk(db, path);
    sqlite3_free(err);
    sqlite3_close(db);
    if (!full.empty()) {
      return Status(StatusCode::kResourceExhausted, "cannot check the head's state " + path + ": " + full);
    }
    return damaged(why);
  }
  std::unique_ptr<SqliteHeadStore> s(new SqliteHeadStore(path, db));
  auto failed = [&](Status st) {
    // A statement that failed (Unavailable, from Error) left SQLite's error code to read.
    if (st.code() == StatusCode::kUnavailable) {
      if (auto why = s->CorruptMessage()) return damaged(*why);
    }
    return st;
  };
  if (auto st = s->Prepare(); !st.ok()) return failed(std::move(st));
  if (auto st = s->CheckFormat(); !st.ok()) return failed(std::move(st));
  return std::unique_ptr<HeadStore>(std::move(s));
}

std::optional<std::string> SqliteHeadStore::CorruptMessage() {
  MutexLock lock(mu_);
  if ((sqlite3_errcode(db_) & 0xff) != SQLITE_CORRUPT) return std::nullopt;
  return std::string(sqlite3_errmsg(db_));
}

Status SqliteHeadStore::Prepare() {
  MutexLock lock(mu_);
  struct {
    sqlite3_stmt** st;
    const char* sql;
  } all[] = {
      {&put_, "INSERT OR REPLACE INTO records (kind, id, value) VALUES (?1, ?2, ?3)"},
      {&del_, "DELETE FROM records WHERE kind = ?1 AND id = ?2"},
      {&load_, "SELECT id, value FROM records WHERE kind = ?1 ORDER BY id"},
      {&count_, "SELECT count(*) FROM records WHERE kind = ?1"},
  };
  for (auto& s : all) {
    if (sqlite3_prepare_v3(db_, s.sql, -1, SQLITE_PREPARE_PERSISTENT, s.st, nullptr) != SQLITE_OK) {
      return Error("preparing a statement");
    }
  }
  return Status();
}

SqliteHeadStore::~SqliteHeadStore() {
  MutexLock lock(mu_);
  for (sqlite3_stmt* s : {put_, del_, load_, count_}) sqlite3_finalize(s);
  sqlite3_close(db_);
}

Status SqliteHeadStore::Error(const char* what) const {
  std::string full = FullDisk(db_, path_);
  if (!full.empty()) {
    return Status(StatusCode::kResourceExhausted, "head state " + path_ + ": " + what + ": " + full);
  }
  return Unavailable(std::string("head state ") + path_ + ": " + what + ": " + sqlite3_errmsg(db_));
}

Status SqliteHeadStore::Put(StoreKind kind, std::string_view id, std::string_view value) {
  MutexLock lock(mu_);
  sqlite3_reset(put_);
  sqlite3_bind_int(put_, 1, static_cast<int>(kind));
  if (auto s = Bind(db_, put_, 2, id); !s.ok()) return s;
  if (auto s = Bind(db_, put_, 3, value); !s.ok()) return s;
  int rc = sqlite3_step(put_);
  sqlite3_reset(put_);
  return rc == SQLITE_DONE ? Status() : Error("writing a record");
}

Status SqliteHeadStore::Delete(StoreKind kind, std::string_view id) {
  MutexLock lock(mu_);
  sqlite3_reset(del_);
  sqlite3_bind_int(del_, 1, static_cast<int>(kind));
  if (auto s = Bind(db_, del_, 2, id); !s.ok()) return s;
  int rc = sqlite3_step(del_);
  sqlite3_reset(del_);
  return rc == SQLITE_DONE ? Status() : Error("deleting a record");
}

StatusOr<std::vector<std::pair<std::string, std::string>>> SqliteHeadStore::LoadAll(StoreKind kind) {
  MutexLock lock(mu_);
  std::vector<std::pair<std::string, std::string>> out;
  sqlite3_reset(load_);
  sqlite3_bind_int(load_, 1, static_cast<int>(kind));
  int rc;
  while ((rc = sqlite3_step(load_)) == SQLITE_ROW) {
    sqlite3_stmt* st = load_;
    auto col = [st](int i) {
      const char* p = static_cast<const char*>(sqlite3_column_blob(st, i));
      return std::string(p ? p : "", static_cast<size_t>(sqlite3_column_bytes(st, i)));
    };
    out.emplace_back(col(0), col(1));
  }
  sqlite3_reset(load_);
  if (rc != SQLITE_DONE) return Error("reading records");
  return out;
}

StatusOr<size_t> SqliteHeadStore::Count(StoreKind kind) {
  MutexLock lock(mu_);
  sqlite3_reset(count_);
  sqlite3_bind_int(count_, 1, static_cast<int>(kind));
  if (sqlite3_step(count_) != SQLITE_ROW) {
    sqlite3_reset(count_);
    return Error("counting records");
  }
  size_t n = static_cast<size_t>(sqlite3_column_int64(count_, 0));
  sqlite3_reset(count_);
  return n;
}

}  // namespace torus
