// Replies over gRPC's default 4 MiB limit: a plan of ~4,000 multi-GPU workers is larger than
// that, and every client channel of the project (common::MakeChannel: the CLI, the launcher,
// LocalCluster) must still read it back. A fake controller answers GetJob with a 6 MiB job.
#include <memory>
#include <string>

#include "common/rpc/tls.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tributary/v1/controller.grpc.pb.h"

namespace tributary::common {
namespace {

class BigJobController final : public v1::Controller::Service {
 public:
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req, v1::Job* job) override {
    job->set_job_id(req->job_id());
    job->set_message(std::string(6 << 20, 'x'));
    return grpc::Status::OK;
  }
};

TEST(LargeReplyTest, ChannelsOfMakeChannelReadRepliesOverFourMebibytes) {
  BigJobController service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string target = "127.0.0.1:" + std::to_string(port);

  auto get = [](const std::shared_ptr<grpc::Channel>& channel, v1::Job* job) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetJobRequest req;
    req.set_job_id("huge");
    return v1::Controller::NewStub(channel)->GetJob(&ctx, req, job);
  };
  // gRPC's default channel refuses it: the limit is what this is about.
  v1::Job job;
  grpc::Status refused = get(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()), &job);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(target, TlsConfig{});
  ASSERT_TRUE(channel.ok()) << channel.status();
  grpc::Status s = get(*channel, &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(job.message().size(), size_t{6} << 20);

  // A caller's own limit stays.
  grpc::ChannelArguments small;
  small.SetMaxReceiveMessageSize(1 << 20);
  channel = MakeChannel(target, TlsConfig{}, small);
  ASSERT_TRUE(channel.ok());
  EXPECT_EQ(get(*channel, &job).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  server->Shutdown();
}

}  // namespace
}  // namespace tributary::common
