// What every subcommand of the `tributary` CLI shares: global options, the controller
// connection, and how a command reports its result.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/rpc/tls.h"
#include "grpcpp/grpcpp.h"
#include "tributary/v1/controller.grpc.pb.h"

namespace tributary::client::cli {

struct GlobalOptions {
  // gRPC target of the controller.
  std::string controller = "127.0.0.1:7070";
  // Deadline of every RPC the CLI makes, milliseconds.
  int rpc_timeout_ms = 10000;
  // spdlog level; empty: TRIBUTARY_LOG_LEVEL, else info.
  std::string log_level;
  // "text" or "json"; empty: TRIBUTARY_LOG_FORMAT, else text.
  std::string log_format;
  // mTLS to the controller (--tls-cert, --tls-key, --tls-ca, --tls-server-name); empty:
  // plaintext.
  common::TlsConfig tls;
  // Result of the subcommand that ran; main prints "error: <message>" and exits 1 if not OK.
  absl::Status status;
};

// Adds --controller, --rpc-timeout-ms, --log-level, --log-format and the --tls-* flags to `app`.
void AddGlobalOptions(CLI::App& app, GlobalOptions& global);

// Makes `run` the action of `command`: it runs after parsing, its result lands in
// global.status. Logging is initialised first.
void SetAction(CLI::App* command, GlobalOptions& global, std::function<absl::Status()> run);

// The controller calls the CLI makes, each with the global deadline; errors keep their code,
// and unreachable-controller errors name the address. Bad TLS files are the error of every call.
class ControllerClient {
 public:
  explicit ControllerClient(const GlobalOptions& global);

  absl::StatusOr<v1::ListNodesResponse> ListNodes();
  // Every page, each job whole.
  absl::StatusOr<v1::ListJobsResponse> ListJobs();
  // Whole, however many pages its plan takes (PlanPage); a re-plan meanwhile restarts the read.
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  // Whole, as GetJob; a dry run's preview stays cut at its first page (it is not kept).
  absl::StatusOr<v1::Job> CreateJob(const v1::CreateJobRequest& request);
  absl::Status DeleteJob(const std::string& job_id);
  absl::StatusOr<v1::JobStats> GetJobStats(const v1::GetJobStatsRequest& request);

 private:
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  absl::Status Convert(const grpc::Status& status) const;
  // One GetJob reply: the page of the job's plan that `token` names ("" = the first).
  absl::StatusOr<v1::Job> GetJobPage(const std::string& job_id, const std::string& token);
  // `first` (one reply) completed with the rest of its plan's pages.
  absl::StatusOr<v1::Job> WholeJob(v1::Job first);

  const GlobalOptions& global_;
  absl::Status channel_status_;  // why no channel could be made (bad --tls-* files)
  std::unique_ptr<v1::Controller::Stub> stub_;
};

// The folder of the running executable (the controller and agent binaries sit next to it).
std::string ExecutableDir();

// A protobuf message as indented JSON with every field (proto field names).
absl::StatusOr<std::string> MessageToJson(const google::protobuf::Message& message);

}  // namespace tributary::client::cli
