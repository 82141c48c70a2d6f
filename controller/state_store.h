// The controller's durable state: jobs (spec, plan, state) and the plan-version high-water mark,
// in an embedded SQLite database.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/sqlite.h"
#include "tributary/v1/controller.pb.h"

namespace tributary::controller {

// One SQLite file, opened in WAL mode with synchronous=FULL and an exclusive lock (a second
// controller on the same file fails at start instead of interleaving writes). FULL, not NORMAL:
// in WAL mode NORMAL survives a killed process but may lose the last commits on a power loss or
// an OS crash, and a lost commit would hand out a plan version (the job's epoch) again after a
// restart. Job changes are rare (create, delete, membership changes), so one fsync each costs
// nothing that matters.
//
// Schema: `schema_version` (one row), `jobs` (job_id, plan_version, the tributary.v1.Job as a
// binary protobuf) and `meta` (key -> integer: max_plan_version, starts). Migrations are explicit
// (state_store.cc, kMigrations): version N is reached from N-1 by one transaction; a file with a
// newer version than this binary knows is refused, never rewritten.
//
// Not thread-safe: ClusterState calls it under its mutex.
class StateStore {
 public:
  static constexpr int kSchemaVersion = 1;

  struct Loaded {
    std::vector<tributary::v1::Job> jobs;  // by job id
    uint64_t max_plan_version = 0;         // highest plan version ever handed out
    uint64_t starts = 0;                   // controller starts on this file, this one included
    bool created = false;                  // the file was new
  };

  // Opens (or creates, when the file does not exist) the database at `path`, checks it (header,
  // size, SQLite's quick_check, schema version) and migrates an older schema. Errors name the
  // file and what to do: DATA_LOSS for a corrupt, truncated or foreign file, FAILED_PRECONDITION
  // for an unknown schema version, UNAVAILABLE for a file that cannot be opened or locked.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& path);

  // Reads every job and counts this start. DATA_LOSS when a row does not parse.
  absl::StatusOr<Loaded> Load();

  // One transaction: writes `put` (insert or replace, by job id), removes `deleted`, and raises
  // the stored plan-version high-water mark to `max_plan_version`. Nothing is written on error.
  absl::Status Commit(const std::vector<const tributary::v1::Job*>& put,
                      const std::vector<std::string>& deleted, uint64_t max_plan_version);

  const std::string& path() const { return db_->path(); }

 private:
  explicit StateStore(std::unique_ptr<SqliteDb> db) : db_(std::move(db)) {}
  absl::Status Prepare();

  std::unique_ptr<SqliteDb> db_;
  std::unique_ptr<SqliteStatement> begin_, commit_, rollback_, put_job_, delete_job_, set_meta_;
};

}  // namespace tributary::controller
