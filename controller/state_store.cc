#include "controller/state_store.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace tributary::controller {
namespace {

namespace fs = std::filesystem;

constexpr auto Log = common::ComponentLog<"controller">;

// Migration i (0-based) takes the schema from version i to version i + 1, in one transaction
// that also records the new version. Append only: never edit a migration that has shipped.
struct Migration {
  const char* description;
  const char* sql;
};
constexpr Migration kMigrations[] = {
    {"jobs with their specs and plans, the plan-version high-water mark",
     "CREATE TABLE schema_version(version INTEGER NOT NULL);"
     "INSERT INTO schema_version(version) VALUES (0);"
     "CREATE TABLE jobs(job_id TEXT PRIMARY KEY, plan_version INTEGER NOT NULL,"
     "                  job BLOB NOT NULL);"
     "CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);"},
};
static_assert(std::size(kMigrations) == StateStore::kSchemaVersion);

constexpr char kCorruptAdvice[] =
    "restore the file from a backup, or move it away to start the controller with no jobs (agents "
    "then drop their jobs and they must be created again)";

// Wraps an error from opening or checking the file with what the operator can do.
absl::Status Explain(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kDataLoss:
      return absl::DataLossError(
          absl::StrCat("state database ", s.message(), "; ", kCorruptAdvice));
    case absl::StatusCode::kFailedPrecondition:
      return s;
    default:
      return absl::Status(s.code(),
                          absl::StrCat("state database ", s.message(),
                                       "; check that the path names a writable file in a writable "
                                       "folder and that no other tributary-controller uses it"));
  }
}

uint32_t BigEndian(const unsigned char* p, int n) {
  uint32_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

// Checks what SQLite itself would accept silently: an empty file (SQLite treats it as a new
// database), a foreign file, a file shorter than its header says (with no WAL holding the rest).
absl::Status CheckFile(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("state database ", path, " is a directory; give the path of a file"));
  }
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(path, ": cannot stat: ", ec.message()));
  if (size == 0) {
    return absl::DataLossError(
        absl::StrCat(path, " is empty (0 bytes): it was truncated or never written"));
  }
  std::ifstream f(path, std::ios::binary);
  if (!f)
    return absl::UnavailableError(absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
  unsigned char header[100] = {};
  f.read(reinterpret_cast<char*>(header), sizeof(header));
  const size_t got = static_cast<size_t>(f.gcount());
  static constexpr char kMagic[] = "SQLite format 3";  // with its NUL: 16 bytes
  if (got < sizeof(kMagic) || std::memcmp(header, kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat(path, " is not an SQLite database (no SQLite header)"));
  }
  if (got < sizeof(header)) {
    return absl::DataLossError(
        absl::StrCat(path, " is truncated: ", size, " bytes, shorter than the SQLite header"));
  }
  uint64_t page_size = BigEndian(header + 16, 2);
  if (page_size == 1) page_size = 65536;
  const uint32_t pages = BigEndian(header + 28, 4);
  // The in-header page count is valid when the change counter matches version-valid-for.
  const bool count_valid = pages > 0 && std::memcmp(header + 24, header + 92, 4) == 0;
  const uintmax_t wal = fs::file_size(path + "-wal", ec);
  const bool wal_holds_pages = !ec && wal > 0;
  if (count_valid && !wal_holds_pages && size < pages * page_size) {
    return absl::DataLossError(absl::StrCat(path, " is truncated: ", size,
                                            " bytes on disk, its header counts ", pages,
                                            " pages of ", page_size, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status Migrate(SqliteDb& db, int64_t from) {
  for (int64_t v = from; v < StateStore::kSchemaVersion; ++v) {
    RETURN_IF_ERROR(db.Exec("BEGIN IMMEDIATE"));
    absl::Status s = db.Exec(kMigrations[v].sql);
    if (s.ok()) s = db.Exec(absl::StrCat("UPDATE schema_version SET version = ", v + 1));
    if (s.ok()) s = db.Exec("COMMIT");
    if (!s.ok()) {
      (void)db.Exec("ROLLBACK");
      return s;
    }
    Log()->info("state database {}: schema migrated to version {} ({})", db.path(), v + 1,
                kMigrations[v].description);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SqliteDb>> OpenChecked(const std::string& path, bool created) {
  ASSIGN_OR_RETURN(std::unique_ptr<SqliteDb> db, SqliteDb::Open(path, created));
  // A restarted controller may race the exit of the one it replaces: wait for its lock.
  RETURN_IF_ERROR(db->Exec("PRAGMA busy_timeout = 2000"));
  RETURN_IF_ERROR(db->Exec("PRAGMA locking_mode = EXCLUSIVE"));
  // Everything is checked before anything is written: a foreign or corrupt file stays as it is.
  if (!created) {
    ASSIGN_OR_RETURN(std::string check, db->QueryText("PRAGMA quick_check"));
    if (check != "ok") {
      return absl::DataLossError(absl::StrCat(path, " is corrupt (quick_check: ", check, ")"));
    }
  }
  ASSIGN_OR_RETURN(
      int64_t has_version,
      db->QueryInt64("SELECT count(*) FROM sqlite_master WHERE name = 'schema_version'"));
  int64_t version = 0;
  if (has_version == 0) {
    ASSIGN_OR_RETURN(int64_t tables, db->QueryInt64("SELECT count(*) FROM sqlite_master"));
    if (tables > 0) {
      return absl::DataLossError(
          absl::StrCat(path, " is an SQLite database but not a Tributary state database (it has ",
                       tables, " schema objects and no schema_version table)"));
    }
  } else {
    ASSIGN_OR_RETURN(int64_t rows, db->QueryInt64("SELECT count(*) FROM schema_version"));
    if (rows != 1) {
      return absl::DataLossError(
          absl::StrCat(path, " is corrupt: schema_version has ", rows, " rows instead of 1"));
    }
    ASSIGN_OR_RETURN(version, db->QueryInt64("SELECT version FROM schema_version"));
  }
  if (version > StateStore::kSchemaVersion || version < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state database ", path, " has schema version ", version,
        ", which this tributary-controller does not know (it reads versions up to ",
        StateStore::kSchemaVersion,
        "): run the tributary-controller that wrote it or a newer one, or move the file away to "
        "start with no jobs"));
  }
  ASSIGN_OR_RETURN(std::string mode, db->QueryText("PRAGMA journal_mode = WAL"));
  if (mode != "wal") {
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot switch to WAL mode (journal_mode is ", mode, ")"));
  }
  RETURN_IF_ERROR(db->Exec("PRAGMA synchronous = FULL"));
  RETURN_IF_ERROR(Migrate(*db, version));
  return db;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("the state database path is empty");
  std::error_code ec;
  const bool exists = fs::exists(path, ec);
  if (exists) {
    if (absl::Status s = CheckFile(path); !s.ok()) return Explain(s);
  }
  absl::StatusOr<std::unique_ptr<SqliteDb>> db = OpenChecked(path, !exists);
  if (!db.ok()) return Explain(db.status());
  std::unique_ptr<StateStore> store(new StateStore(*std::move(db)));
  if (absl::Status s = store->Prepare(); !s.ok()) return Explain(s);
  return store;
}

absl::Status StateStore::Prepare() {
  auto prepare = [this](std::unique_ptr<SqliteStatement>& out, const char* sql) -> absl::Status {
    ASSIGN_OR_RETURN(SqliteStatement stmt, db_->Prepare(sql));
    out = std::make_unique<SqliteStatement>(std::move(stmt));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(prepare(begin_, "BEGIN IMMEDIATE"));
  RETURN_IF_ERROR(prepare(commit_, "COMMIT"));
  RETURN_IF_ERROR(prepare(rollback_, "ROLLBACK"));
  RETURN_IF_ERROR(prepare(put_job_,
                          "INSERT INTO jobs(job_id, plan_version, job) VALUES (?1, ?2, ?3) "
                          "ON CONFLICT(job_id) DO UPDATE SET plan_version = excluded.plan_version, "
                          "job = excluded.job"));
  RETURN_IF_ERROR(prepare(delete_job_, "DELETE FROM jobs WHERE job_id = ?1"));
  RETURN_IF_ERROR(prepare(set_meta_,
                          "INSERT INTO meta(key, value) VALUES (?1, ?2) "
                          "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)"));
  return absl::OkStatus();
}

absl::StatusOr<StateStore::Loaded> StateStore::Load() {
  Loaded out;
  {
    ASSIGN_OR_RETURN(SqliteStatement rows,
                     db_->Prepare("SELECT job_id, plan_version, job FROM jobs ORDER BY job_id"));
    while (true) {
      absl::StatusOr<bool> row = rows.Step();
      if (!row.ok()) return Explain(row.status());
      if (!*row) break;
      const std::string id = rows.ColumnText(0);
      const int64_t version = rows.ColumnInt64(1);
      tributary::v1::Job job;
      if (!job.ParseFromString(rows.ColumnBlob(2)) || job.job_id() != id ||
          static_cast<int64_t>(job.plan().version()) != version) {
        return absl::DataLossError(absl::StrCat("state database ", path(), ": the row of job '", id,
                                                "' is corrupt; ", kCorruptAdvice));
      }
      out.max_plan_version = std::max<uint64_t>(out.max_plan_version, version);
      out.jobs.push_back(std::move(job));
    }
  }
  {
    ASSIGN_OR_RETURN(SqliteStatement meta, db_->Prepare("SELECT key, value FROM meta"));
    while (true) {
      absl::StatusOr<bool> row = meta.Step();
      if (!row.ok()) return Explain(row.status());
      if (!*row) break;
      const std::string key = meta.ColumnText(0);
      const auto value = static_cast<uint64_t>(meta.ColumnInt64(1));
      if (key == "max_plan_version") out.max_plan_version = std::max(out.max_plan_version, value);
      if (key == "starts") out.starts = value;
    }
  }
  out.created = out.starts == 0;
  // Counting the start is also the first write: it takes the exclusive lock now.
  ++out.starts;
  RETURN_IF_ERROR(set_meta_->BindText(1, "starts"));
  RETURN_IF_ERROR(set_meta_->BindInt64(2, static_cast<int64_t>(out.starts)));
  if (absl::Status s = set_meta_->Run(); !s.ok()) return Explain(s);
  return out;
}

absl::Status StateStore::Commit(const std::vector<const tributary::v1::Job*>& put,
                                const std::vector<std::string>& deleted,
                                uint64_t max_plan_version) {
  RETURN_IF_ERROR(begin_->Run());
  auto body = [&]() -> absl::Status {
    for (const tributary::v1::Job* job : put) {
      RETURN_IF_ERROR(put_job_->BindText(1, job->job_id()));
      RETURN_IF_ERROR(put_job_->BindInt64(2, static_cast<int64_t>(job->plan().version())));
      RETURN_IF_ERROR(put_job_->BindBlob(3, job->SerializeAsString()));
      RETURN_IF_ERROR(put_job_->Run());
    }
    for (const std::string& id : deleted) {
      RETURN_IF_ERROR(delete_job_->BindText(1, id));
      RETURN_IF_ERROR(delete_job_->Run());
    }
    RETURN_IF_ERROR(set_meta_->BindText(1, "max_plan_version"));
    RETURN_IF_ERROR(set_meta_->BindInt64(2, static_cast<int64_t>(max_plan_version)));
    RETURN_IF_ERROR(set_meta_->Run());
    return commit_->Run();
  };
  absl::Status s = body();
  if (!s.ok()) {
    // A failed COMMIT may leave the transaction open; ROLLBACK when none is open is harmless.
    (void)rollback_->Run();
  }
  return s;
}

}  // namespace tributary::controller
