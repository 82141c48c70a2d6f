// A small RAII wrapper over the SQLite C API: a connection and its prepared statements, every
// failure an absl::Status naming the call, the database file and SQLite's reason.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tributary::controller {

class SqliteDb;

// One prepared statement. Owned by the caller; must not outlive its SqliteDb. Not thread-safe.
class SqliteStatement {
 public:
  SqliteStatement(SqliteStatement&&) noexcept;
  SqliteStatement& operator=(SqliteStatement&&) noexcept;
  ~SqliteStatement();

  // Parameters are 1-based, as in sqlite3_bind_*. Text and blobs are copied (SQLITE_TRANSIENT).
  absl::Status BindInt64(int index, int64_t value);
  absl::Status BindText(int index, std::string_view value);
  absl::Status BindBlob(int index, std::string_view bytes);
  // Runs one step: true when a row is ready (read it with Column*), false when done.
  absl::StatusOr<bool> Step();
  // Runs to completion, discarding rows, then resets: for INSERT / UPDATE / DELETE.
  absl::Status Run();
  // Ready to run again; bindings are cleared.
  void Reset();

  // Columns are 0-based, as in sqlite3_column_*.
  int64_t ColumnInt64(int column) const;
  std::string ColumnText(int column) const;
  std::string ColumnBlob(int column) const;

 private:
  friend class SqliteDb;
  SqliteStatement(sqlite3_stmt* stmt, const SqliteDb* db) : stmt_(stmt), db_(db) {}

  sqlite3_stmt* stmt_ = nullptr;
  const SqliteDb* db_ = nullptr;
};

// One connection. Not thread-safe: the owner serializes its use.
class SqliteDb {
 public:
  // Opens `path` read-write, creating it when `create` is set (SQLITE_OPEN_FULLMUTEX is not
  // used: the owner serializes). Errors are UNAVAILABLE and name the file.
  static absl::StatusOr<std::unique_ptr<SqliteDb>> Open(const std::string& path, bool create);
  ~SqliteDb();
  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;

  // Runs SQL without results (several statements allowed).
  absl::Status Exec(const std::string& sql);
  absl::StatusOr<SqliteStatement> Prepare(const std::string& sql);
  // The first column of the first row of `sql`, as an integer.
  absl::StatusOr<int64_t> QueryInt64(const std::string& sql);
  // The first column of the first row of `sql`, as text.
  absl::StatusOr<std::string> QueryText(const std::string& sql);

  const std::string& path() const { return path_; }
  // An error for the last failed call on this connection: `what` (the call), the file, SQLite's
  // message. Corruption codes (SQLITE_CORRUPT, SQLITE_NOTADB) map to DATA_LOSS, others to
  // UNAVAILABLE.
  absl::Status Error(const std::string& what, int rc) const;

 private:
  SqliteDb(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}

  sqlite3* db_;
  std::string path_;
};

}  // namespace tributary::controller
