#include "client/cli/cli_common.h"

#include <chrono>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/tls_flags.h"
#include "google/protobuf/util/json_util.h"
#include "tributary/v1/plan_pages.h"

namespace tributary::client::cli {

void AddGlobalOptions(CLI::App& app, GlobalOptions& global) {
  app.add_option("--controller", global.controller, "controller address host:port")
      ->capture_default_str();
  app.add_option("--rpc-timeout-ms", global.rpc_timeout_ms, "deadline of every RPC, ms")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--log-level", global.log_level,
                 "trace, debug, info, warn, error, off (default: $TRIBUTARY_LOG_LEVEL or info)");
  app.add_option("--log-format", global.log_format,
                 "text or json (one JSON object per line; default: $TRIBUTARY_LOG_FORMAT or text)");
  common::AddTlsFlags(app, global.tls, /*client=*/true);
}

void SetAction(CLI::App* command, GlobalOptions& global, std::function<absl::Status()> run) {
  command->callback([&global, run = std::move(run)] {
    common::InitLogging(global.log_level, global.log_format);
    global.status = run();
  });
}

ControllerClient::ControllerClient(const GlobalOptions& global) : global_(global) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      common::MakeChannel(global.controller, global.tls);
  if (channel.ok()) {
    stub_ = v1::Controller::NewStub(*channel);
  } else {
    channel_status_ = channel.status();
  }
}

std::unique_ptr<grpc::ClientContext> ControllerClient::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(global_.rpc_timeout_ms));
  return context;
}

absl::Status ControllerClient::Convert(const grpc::Status& status) const {
  if (!channel_status_.ok()) return channel_status_;
  absl::Status s = common::FromGrpcStatus(status);
  if (s.code() == absl::StatusCode::kUnavailable ||
      (s.code() == absl::StatusCode::kDeadlineExceeded && s.message() == "Deadline Exceeded")) {
    // A TLS mismatch shows as an unreachable controller; say what to check.
    const char* hint =
        s.code() != absl::StatusCode::kUnavailable ? ""
        : global_.tls.enabled()
            ? " (with mTLS: is the controller's certificate signed by --tls-ca and does it name "
              "the controller's host or --tls-server-name?)"
            : " (if the controller uses mTLS, pass --tls-cert, --tls-key and --tls-ca)";
    return absl::Status(s.code(),
                        absl::StrCat("controller ", global_.controller, ": ", s.message(), hint));
  }
  return s;
}

absl::StatusOr<v1::ListNodesResponse> ControllerClient::ListNodes() {
  if (!channel_status_.ok()) return channel_status_;
  // Every page, merged: each reply stays far below gRPC's message limit at any cluster size.
  v1::ListNodesResponse all;
  v1::ListNodesRequest request;
  do {
    v1::ListNodesResponse page;
    auto context = NewContext();
    grpc::Status status = stub_->ListNodes(context.get(), request, &page);
    if (!status.ok()) return Convert(status);
    for (auto& node : *page.mutable_nodes()) *all.add_nodes() = std::move(node);
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return all;
}

absl::StatusOr<v1::ListJobsResponse> ControllerClient::ListJobs() {
  if (!channel_status_.ok()) return channel_status_;
  // Every page, merged, and every job whole: a job whose plan was cut is read on with GetJob.
  v1::ListJobsResponse all;
  v1::ListJobsRequest request;
  do {
    v1::ListJobsResponse page;
    auto context = NewContext();
    grpc::Status status = stub_->ListJobs(context.get(), request, &page);
    if (!status.ok()) return Convert(status);
    for (v1::Job& job : *page.mutable_jobs()) {
      absl::StatusOr<v1::Job> whole = WholeJob(std::move(job));
      if (whole.status().code() == absl::StatusCode::kNotFound) continue;  // deleted meanwhile
      if (!whole.ok()) return whole.status();
      *all.add_jobs() = *std::move(whole);
    }
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return all;
}

absl::StatusOr<v1::Job> ControllerClient::GetJobPage(const std::string& job_id,
                                                     const std::string& token) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.set_plan_page_token(token);
  v1::Job response;
  auto context = NewContext();
  grpc::Status status = stub_->GetJob(context.get(), request, &response);
  if (!status.ok()) return Convert(status);
  return response;
}

absl::StatusOr<v1::Job> ControllerClient::WholeJob(v1::Job first) {
  const std::string job_id = first.job_id();
  auto get = [&](const std::string& token) { return GetJobPage(job_id, token); };
  // A re-plan between two pages (ABORTED) starts the read again; a job re-planned on every
  // read for this long is an error.
  constexpr int kAttempts = 5;
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<v1::Job> whole = v1::ReadRestOfPlan(std::move(first), get);
    if (whole.status().code() != absl::StatusCode::kAborted || attempt + 1 == kAttempts) {
      return whole;
    }
    absl::StatusOr<v1::Job> again = get("");
    if (!again.ok()) return again.status();
    first = *std::move(again);
  }
}

absl::StatusOr<v1::Job> ControllerClient::GetJob(const std::string& job_id) {
  if (!channel_status_.ok()) return channel_status_;
  absl::StatusOr<v1::Job> first = GetJobPage(job_id, "");
  if (!first.ok()) return first.status();
  return WholeJob(*std::move(first));
}

absl::StatusOr<v1::JobStats> ControllerClient::GetJobStats(const v1::GetJobStatsRequest& request) {
  if (!channel_status_.ok()) return channel_status_;
  v1::JobStats response;
  auto context = NewContext();
  grpc::Status status = stub_->GetJobStats(context.get(), request, &response);
  if (!status.ok()) return Convert(status);
  return response;
}

absl::StatusOr<v1::Job> ControllerClient::CreateJob(const v1::CreateJobRequest& request) {
  if (!channel_status_.ok()) return channel_status_;
  v1::Job response;
  auto context = NewContext();
  grpc::Status status = stub_->CreateJob(context.get(), request, &response);
  if (!status.ok()) return Convert(status);
  // The rest of a large plan (a dry run's preview has none to read: it stays cut).
  return WholeJob(std::move(response));
}

absl::Status ControllerClient::DeleteJob(const std::string& job_id) {
  if (!channel_status_.ok()) return channel_status_;
  v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  v1::DeleteJobResponse response;
  auto context = NewContext();
  return Convert(stub_->DeleteJob(context.get(), request, &response));
}

absl::StatusOr<std::string> MessageToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("converting to JSON failed: ", std::string(status.message())));
  }
  return out;
}

std::string ExecutableDir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

}  // namespace tributary::client::cli
