#include "controller/sqlite.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tributary::controller {

SqliteStatement::SqliteStatement(SqliteStatement&& o) noexcept
    : stmt_(std::exchange(o.stmt_, nullptr)), db_(o.db_) {}

SqliteStatement& SqliteStatement::operator=(SqliteStatement&& o) noexcept {
  if (this != &o) {
    if (stmt_ != nullptr) sqlite3_finalize(stmt_);
    stmt_ = std::exchange(o.stmt_, nullptr);
    db_ = o.db_;
  }
  return *this;
}

SqliteStatement::~SqliteStatement() {
  if (stmt_ != nullptr) sqlite3_finalize(stmt_);
}

absl::Status SqliteStatement::BindInt64(int index, int64_t value) {
  const int rc = sqlite3_bind_int64(stmt_, index, value);
  return rc == SQLITE_OK ? absl::OkStatus() : db_->Error("sqlite3_bind_int64", rc);
}

absl::Status SqliteStatement::BindText(int index, std::string_view value) {
  const int rc = sqlite3_bind_text64(stmt_, index, value.empty() ? "" : value.data(), value.size(),
                                     SQLITE_TRANSIENT, SQLITE_UTF8);  // null would bind NULL
  return rc == SQLITE_OK ? absl::OkStatus() : db_->Error("sqlite3_bind_text", rc);
}

absl::Status SqliteStatement::BindBlob(int index, std::string_view bytes) {
  const int rc = sqlite3_bind_blob64(stmt_, index, bytes.empty() ? "" : bytes.data(), bytes.size(),
                                     SQLITE_TRANSIENT);
  return rc == SQLITE_OK ? absl::OkStatus() : db_->Error("sqlite3_bind_blob", rc);
}

absl::StatusOr<bool> SqliteStatement::Step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  absl::Status error = db_->Error(absl::StrCat("sqlite3_step(", sqlite3_sql(stmt_), ")"), rc);
  sqlite3_reset(stmt_);
  return error;
}

absl::Status SqliteStatement::Run() {
  while (true) {
    absl::StatusOr<bool> row = Step();
    if (!row.ok()) {
      Reset();
      return row.status();
    }
    if (!*row) break;
  }
  Reset();
  return absl::OkStatus();
}

void SqliteStatement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

int64_t SqliteStatement::ColumnInt64(int column) const {
  return sqlite3_column_int64(stmt_, column);
}

std::string SqliteStatement::ColumnText(int column) const {
  const unsigned char* text = sqlite3_column_text(stmt_, column);
  const int n = sqlite3_column_bytes(stmt_, column);
  return text == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(text), n);
}

std::string SqliteStatement::ColumnBlob(int column) const {
  const void* blob = sqlite3_column_blob(stmt_, column);
  const int n = sqlite3_column_bytes(stmt_, column);
  return blob == nullptr ? std::string() : std::string(static_cast<const char*>(blob), n);
}

absl::StatusOr<std::unique_ptr<SqliteDb>> SqliteDb::Open(const std::string& path, bool create) {
  sqlite3* db = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0);
  const int rc = sqlite3_open_v2(path.c_str(), &db, flags, nullptr);
  if (rc != SQLITE_OK) {
    const std::string reason = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);  // a handle comes back even on failure (null is a no-op)
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot open: ", reason, " (sqlite3_open_v2)"));
  }
  sqlite3_extended_result_codes(db, 1);
  return std::unique_ptr<SqliteDb>(new SqliteDb(db, path));
}

SqliteDb::~SqliteDb() { sqlite3_close_v2(db_); }

absl::Status SqliteDb::Error(const std::string& what, int rc) const {
  const std::string msg = absl::StrCat(path_, ": ", what, " failed: ", sqlite3_errmsg(db_), " (",
                                       sqlite3_errstr(rc), ")");
  switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

absl::Status SqliteDb::Exec(const std::string& sql) {
  char* err = nullptr;
  const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
  sqlite3_free(err);  // sqlite3_errmsg has the same text
  return rc == SQLITE_OK ? absl::OkStatus() : Error(absl::StrCat("\"", sql, "\""), rc);
}

absl::StatusOr<SqliteStatement> SqliteDb::Prepare(const std::string& sql) {
  sqlite3_stmt* stmt = nullptr;
  const int rc = sqlite3_prepare_v2(db_, sql.c_str(), static_cast<int>(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return Error(absl::StrCat("preparing \"", sql, "\""), rc);
  }
  return SqliteStatement(stmt, this);
}

absl::StatusOr<int64_t> SqliteDb::QueryInt64(const std::string& sql) {
  absl::StatusOr<SqliteStatement> stmt = Prepare(sql);
  if (!stmt.ok()) return stmt.status();
  absl::StatusOr<bool> row = stmt->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat(path_, ": \"", sql, "\" returned no row"));
  return stmt->ColumnInt64(0);
}

absl::StatusOr<std::string> SqliteDb::QueryText(const std::string& sql) {
  absl::StatusOr<SqliteStatement> stmt = Prepare(sql);
  if (!stmt.ok()) return stmt.status();
  absl::StatusOr<bool> row = stmt->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat(path_, ": \"", sql, "\" returned no row"));
  return stmt->ColumnText(0);
}

}  // namespace tributary::controller
