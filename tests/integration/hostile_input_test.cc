// Issue 13: one table of hostile or bad inputs against a real cluster -- the controller's gRPC
// port, an agent's local gRPC socket, its buffer socket and its data-plane port. Every row
// asserts the exact status code and what the message must say; after every row the process it
// hit must still serve (a probe call), and at the end an all-reduce of a job that existed all
// along is exact on every rank (no job's data was touched).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/buffer_channel.h"
#include "client/client.h"
#include "client/cluster/local_cluster.h"
#include "common/buffer_socket_protocol.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "common/unix_fd.h"
#include "dataplane/transport/tcp/tcp_wire.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tributary/v1/agent.grpc.pb.h"
#include "tributary/v1/controller.grpc.pb.h"

namespace tributary {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr int kHostileWorkers = 2;
constexpr int kHostileSpares = 1;

struct Row {
  std::string name;
  std::function<absl::Status()> input;
  absl::StatusCode code;
  std::string message;  // what the message must contain
  enum Target { kController, kAgent, kDataPlane } target;
};

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + 10s);
  return ctx;
}

common::UniqueFd Memfd(size_t size, bool seal) {
  common::UniqueFd fd(memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (ftruncate(fd.get(), static_cast<off_t>(size)) != 0) return {};
  if (seal) fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  return fd;
}

// Writes `bytes` to the TCP port of `address` and waits (bounded) until the peer closes: OK when
// it closed the connection on us, UNAVAILABLE when it could not be reached at all.
absl::Status RawToDataPlane(const std::string& address, const std::vector<std::byte>& bytes) {
  const uint16_t port = static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
  common::UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(port);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", address));
  }
  timeval timeout{.tv_sec = 10, .tv_usec = 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
  shutdown(fd.get(), SHUT_WR);
  std::byte scratch[256];
  ssize_t r;
  while ((r = recv(fd.get(), scratch, sizeof(scratch), 0)) > 0) {
  }
  if (r == 0 || errno == ECONNRESET) {
    return absl::AbortedError("the agent closed the connection");
  }
  return absl::DeadlineExceededError("the agent kept a hostile connection open");
}

class HostileInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    client::LocalClusterOptions o;
    o.bin_dir = TRIBUTARY_BIN_DIR;
    o.workers = kHostileWorkers;
    o.spares = kHostileSpares;
    o.nic_gbps = {10};
    o.sum_gbps = 4;
    o.heartbeat_timeout = std::chrono::seconds(30);
    auto c = client::LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  static client::LocalCluster* cluster_;
};

client::LocalCluster* HostileInputTest::cluster_ = nullptr;

TEST_F(HostileInputTest, FortyHostileInputsGetTheirStatusAndNothingBreaks) {
  v1::Controller::Stub& controller = cluster_->controller();
  // A job that exists throughout; its all-reduce at the end must be exact.
  {
    v1::CreateJobRequest req;
    req.set_job_id("victim");
    for (const auto& w : cluster_->worker_node_ids()) req.mutable_spec()->add_worker_nodes(w);
    req.mutable_spec()->set_procs_per_node(1);
    v1::Job job;
    ASSERT_TRUE(controller.CreateJob(Context().get(), req, &job).ok());
  }
  std::vector<std::unique_ptr<client::Client>> clients;
  for (int node = 0; node < kHostileWorkers; ++node) {
    client::ClientOptions options;
    options.agent_address = cluster_->agent_address(node);
    options.join_timeout = 20s;
    auto c = client::Client::Connect(options, "victim", 0, 1);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(*std::move(c));
  }
  auto buffer = clients[0]->AllocateBuffer(4096);
  ASSERT_TRUE(buffer.ok());
  const std::string session = clients[0]->session_id();
  auto agent = v1::Agent::NewStub(
      grpc::CreateChannel(cluster_->agent_address(0), grpc::InsecureChannelCredentials()));
  auto buffers = client::internal::BufferChannel::Connect(cluster_->agent_address(0));
  ASSERT_TRUE(buffers.ok()) << buffers.status();

  v1::ListNodesResponse nodes;
  ASSERT_TRUE(controller.ListNodes(Context().get(), {}, &nodes).ok());
  const std::string data_plane = nodes.nodes(0).inventory().data_plane_address();

  const auto register_node = [&](const std::string& id, const std::string& address, double nic,
                                 double sum) {
    return [&controller, id, address, nic, sum] {
      v1::RegisterNodeRequest req;
      req.set_node_id(id);
      req.mutable_inventory()->set_data_plane_address(address);
      req.mutable_inventory()->set_nic_bytes_per_s(nic);
      req.mutable_inventory()->set_sum_bytes_per_s(sum);
      req.mutable_inventory()->set_offers_summation(true);
      v1::RegisterNodeResponse resp;
      return common::FromGrpcStatus(controller.RegisterNode(Context().get(), req, &resp));
    };
  };
  const auto create_job = [&](const std::string& id, std::vector<std::string> workers,
                              uint32_t procs = 1) {
    return [&controller, id, workers, procs] {
      v1::CreateJobRequest req;
      req.set_job_id(id);
      for (const auto& w : workers) req.mutable_spec()->add_worker_nodes(w);
      req.mutable_spec()->set_procs_per_node(procs);
      v1::Job job;
      return common::FromGrpcStatus(controller.CreateJob(Context().get(), req, &job));
    };
  };
  const auto submit = [&](std::function<void(v1::SubmitRequest&)> mutate) {
    return [&agent, &session, b = (*buffer)->id(), mutate] {
      v1::SubmitRequest req;
      req.set_session_id(session);
      req.set_tensor_name("hostile");
      req.set_buffer_id(b);
      req.set_count(16);
      req.set_dtype(v1::DATA_TYPE_FLOAT32);
      req.set_op(v1::COLLECTIVE_OP_SUM);
      mutate(req);
      v1::SubmitResponse resp;
      return common::FromGrpcStatus(agent->Submit(Context().get(), req, &resp));
    };
  };
  const auto register_buffer = [&](const std::string& session_id, int fd_size, bool seal,
                                   uint64_t declared) {
    return [&buffers, session_id, fd_size, seal, declared] {
      common::UniqueFd fd = Memfd(static_cast<size_t>(fd_size), seal);
      return (*buffers)->Register(session_id, fd.get(), declared, 5s).status();
    };
  };
  const auto raw_buffer_socket = [&](std::vector<std::byte> bytes, bool with_fd) {
    return [&, bytes, with_fd]() -> absl::Status {
      common::UniqueFd socket_fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
      sockaddr_un address{};
      address.sun_family = AF_UNIX;
      const std::string path = common::buffer_socket::PathFor(cluster_->agent_address(0).substr(5));
      std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
      if (connect(socket_fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
        return absl::UnavailableError("cannot connect to the buffer socket");
      }
      common::UniqueFd memfd = Memfd(64, true);
      RETURN_IF_ERROR(common::SendWithFd(socket_fd.get(), bytes, with_fd ? memfd.get() : -1));
      common::buffer_socket::Response response;
      RETURN_IF_ERROR(common::ReceiveWithFd(
          socket_fd.get(), {reinterpret_cast<std::byte*>(&response), sizeof(response)}, nullptr,
          5000ms));
      return absl::Status(static_cast<absl::StatusCode>(response.code), response.message);
    };
  };
  const auto bytes = [](const std::string& text) {
    std::vector<std::byte> out(text.size());
    std::memcpy(out.data(), text.data(), text.size());
    return out;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::byte> huge_frame(dataplane::tcp::kFrameHeaderBytes);
  dataplane::tcp::EncodeFrameHeader({.payload_length = uint64_t{1} << 40}, huge_frame.data());
  std::vector<std::byte> hello_then_huge = dataplane::tcp::EncodeHello("127.0.0.1:9");
  hello_then_huge.insert(hello_then_huge.end(), huge_frame.begin(), huge_frame.end());
  std::vector<std::byte> hello_then_text = dataplane::tcp::EncodeHello("127.0.0.1:9");
  for (std::byte b : bytes("not a frame at all")) hello_then_text.push_back(b);
  common::buffer_socket::Request bad_version;
  bad_version.version = 77;
  common::buffer_socket::Request no_fd;
  std::strncpy(no_fd.session_id, session.c_str(), sizeof(no_fd.session_id) - 1);
  no_fd.size_bytes = 64;
  const auto request_bytes = [](const common::buffer_socket::Request& r) {
    std::vector<std::byte> out(sizeof(r));
    std::memcpy(out.data(), &r, sizeof(r));
    return out;
  };
  const std::vector<std::string> workers = cluster_->worker_node_ids();
  using C = absl::StatusCode;

  const std::vector<Row> rows = {
      // --- the controller's gRPC port
      {"registration: infinite NIC bandwidth", register_node("evil", "127.0.0.1:9", inf, 1e9),
       C::kInvalidArgument, "nic_bytes_per_s inf", Row::kController},
      {"registration: NaN NIC bandwidth", register_node("evil", "127.0.0.1:9", nan, 1e9),
       C::kInvalidArgument, "nic_bytes_per_s nan", Row::kController},
      {"registration: zero NIC bandwidth", register_node("evil", "127.0.0.1:9", 0, 1e9),
       C::kInvalidArgument, "nic_bytes_per_s 0 must be finite and in (0, 1e13]", Row::kController},
      {"registration: negative summation rate", register_node("evil", "127.0.0.1:9", 1e9, -1),
       C::kInvalidArgument, "sum_bytes_per_s -1", Row::kController},
      {"registration: 10^20 bytes/s", register_node("evil", "127.0.0.1:9", 1e20, 1e9),
       C::kInvalidArgument, "nic_bytes_per_s 1e+20", Row::kController},
      {"registration: a host name for an address",
       register_node("evil", "evil.example:80", 1e9, 1e9), C::kInvalidArgument,
       "must be a numeric a.b.c.d:port", Row::kController},
      {"registration: port 0", register_node("evil", "127.0.0.1:0", 1e9, 1e9), C::kInvalidArgument,
       "port in 1-65535", Row::kController},
      {"registration: no address", register_node("evil", "", 1e9, 1e9), C::kInvalidArgument,
       "registered without a data_plane_address", Row::kController},
      {"registration: node id with a slash", register_node("a/b", "127.0.0.1:9", 1e9, 1e9),
       C::kInvalidArgument, "node_id 'a/b' must be 1-128 characters", Row::kController},
      {"registration: 200-character node id",
       register_node(std::string(200, 'x'), "127.0.0.1:9", 1e9, 1e9), C::kInvalidArgument,
       "must be 1-128 characters", Row::kController},
      {"registration: a 64 MiB message",
       [&] {
         v1::RegisterNodeRequest req;
         req.set_node_id("huge");
         req.mutable_inventory()->set_hostname(std::string(64 << 20, 'h'));
         v1::RegisterNodeResponse resp;
         return common::FromGrpcStatus(controller.RegisterNode(Context().get(), req, &resp));
       },
       C::kResourceExhausted, "", Row::kController},
      {"heartbeat of an unknown node",
       [&] {
         v1::HeartbeatRequest req;
         req.set_node_id("never-registered");
         v1::HeartbeatResponse resp;
         return common::FromGrpcStatus(controller.Heartbeat(Context().get(), req, &resp));
       },
       C::kNotFound, "never-registered", Row::kController},
      {"assignments of an unknown node",
       [&] {
         v1::GetAssignmentsRequest req;
         req.set_node_id("never-registered");
         v1::GetAssignmentsResponse resp;
         return common::FromGrpcStatus(controller.GetAssignments(Context().get(), req, &resp));
       },
       C::kNotFound, "never-registered", Row::kController},
      {"job without workers", create_job("nobody", {}), C::kInvalidArgument, "worker",
       Row::kController},
      {"job with the same worker twice", create_job("twice", {workers[0], workers[0]}),
       C::kInvalidArgument, workers[0], Row::kController},
      {"job with an unknown worker", create_job("ghost", {"no-such-node"}), C::kNotFound,
       "worker node 'no-such-node' is not registered", Row::kController},
      {"job id with spaces", create_job("a job", {workers[0]}), C::kInvalidArgument,
       "job_id 'a job' must be 1-128 characters", Row::kController},
      {"job that exists with another spec", create_job("victim", {workers[0]}), C::kAlreadyExists,
       "exists with a different spec", Row::kController},
      {"unknown job",
       [&] {
         v1::GetJobRequest req;
         req.set_job_id("no-such-job");
         v1::Job job;
         return common::FromGrpcStatus(controller.GetJob(Context().get(), req, &job));
       },
       C::kNotFound, "job 'no-such-job' not found", Row::kController},
      {"plan page token that GetJob did not write",
       [&] {
         v1::GetJobRequest req;
         req.set_job_id("victim");
         req.set_plan_page_token("v1.2; DROP TABLE jobs");
         v1::Job job;
         return common::FromGrpcStatus(controller.GetJob(Context().get(), req, &job));
       },
       C::kInvalidArgument, "plan_page_token is not one GetJob", Row::kController},
      {"list page token that is no job id",
       [&] {
         v1::ListJobsRequest req;
         req.set_page_token(std::string(300, '/'));
         v1::ListJobsResponse resp;
         return common::FromGrpcStatus(controller.ListJobs(Context().get(), req, &resp));
       },
       C::kInvalidArgument, "page_token is not one ListJobs returned", Row::kController},
      // --- the agent's local gRPC socket
      {"join of a job the node does not work for",
       [&] {
         v1::JoinJobRequest req;
         req.set_job_id("no-such-job");
         req.set_local_size(1);
         v1::JoinJobResponse resp;
         return common::FromGrpcStatus(agent->JoinJob(Context().get(), req, &resp));
       },
       // Indistinguishable from a job whose plan has not reached the node yet: retry later.
       C::kFailedPrecondition, "no-such-job", Row::kAgent},
      {"join with local rank beyond local size",
       [&] {
         v1::JoinJobRequest req;
         req.set_job_id("victim");
         req.set_local_rank(5);
         req.set_local_size(1);
         v1::JoinJobResponse resp;
         return common::FromGrpcStatus(agent->JoinJob(Context().get(), req, &resp));
       },
       C::kInvalidArgument, "local", Row::kAgent},
      {"submit on an unknown session", submit([](auto& r) { r.set_session_id("forged"); }),
       C::kNotFound, "session 'forged' not found", Row::kAgent},
      {"submit on an unknown buffer", submit([](auto& r) { r.set_buffer_id(999); }),
       C::kInvalidArgument, "buffer 999 is not registered", Row::kAgent},
      {"submit past the buffer's end", submit([](auto& r) { r.set_offset_bytes(4090); }),
       C::kInvalidArgument, "do not fit buffer", Row::kAgent},
      {"submit of an unknown dtype", submit([](auto& r) { r.set_dtype(v1::DataType(99)); }),
       C::kInvalidArgument, "unknown dtype 99", Row::kAgent},
      {"submit of an unknown op", submit([](auto& r) { r.set_op(v1::CollectiveOp(42)); }),
       C::kInvalidArgument, "42", Row::kAgent},
      {"submit without a tensor name", submit([](auto& r) { r.set_tensor_name(""); }),
       C::kInvalidArgument, "tensor names must have 1 to", Row::kAgent},
      {"submit with a 2000-byte tensor name",
       submit([](auto& r) { r.set_tensor_name(std::string(2000, 'n')); }), C::kInvalidArgument,
       "tensor names must have 1 to 1024 bytes", Row::kAgent},
      {"wait on an unknown handle",
       [&] {
         v1::WaitRequest req;
         req.set_session_id(session);
         req.set_handle(123456);
         req.set_timeout_ms(10);
         v1::WaitResponse resp;
         return common::FromGrpcStatus(agent->Wait(Context().get(), req, &resp));
       },
       C::kNotFound, "123456", Row::kAgent},
      {"a second control ring for a session",
       [&] {
         v1::AttachControlRingRequest req;
         req.set_session_id(session);
         req.set_buffer_id(777);
         v1::AttachControlRingResponse resp;
         return common::FromGrpcStatus(agent->AttachControlRing(Context().get(), req, &resp));
       },
       C::kAlreadyExists, "already has a control ring", Row::kAgent},
      // --- the agent's buffer socket
      {"buffer socket: 16 bytes of 0xff",
       raw_buffer_socket(std::vector<std::byte>(16, std::byte{0xff}), false), C::kInvalidArgument,
       "message of 16 bytes, expected 120", Row::kAgent},
      {"buffer socket: wrong version", raw_buffer_socket(request_bytes(bad_version), true),
       C::kInvalidArgument, "not a buffer-socket request", Row::kAgent},
      {"buffer socket: request without a descriptor",
       raw_buffer_socket(request_bytes(no_fd), false), C::kInvalidArgument,
       "carries no file descriptor", Row::kAgent},
      {"buffer socket: unsealed memfd (could shrink: SIGBUS)",
       register_buffer(session, 64, false, 64), C::kInvalidArgument,
       "must be sealed with F_SEAL_SHRINK and F_SEAL_GROW", Row::kAgent},
      {"buffer socket: memfd smaller than declared", register_buffer(session, 64, true, 1 << 20),
       C::kInvalidArgument, "fewer than the 1048576 declared", Row::kAgent},
      {"buffer socket: unknown session", register_buffer("forged-session", 64, true, 64),
       C::kNotFound, "forged-session", Row::kAgent},
      {"buffer socket: zero bytes", register_buffer(session, 64, true, 0), C::kInvalidArgument,
       "buffer size 0 bytes is not in [1, 1 TiB]", Row::kAgent},
      // --- the data-plane port (the agent closes the connection: ABORTED here)
      {"data plane: 16 bytes of 0xff",
       [&] { return RawToDataPlane(data_plane, std::vector<std::byte>(16, std::byte{0xff})); },
       C::kAborted, "closed", Row::kDataPlane},
      {"data plane: an HTTP request",
       [&] { return RawToDataPlane(data_plane, bytes("GET / HTTP/1.1\r\n\r\n")); }, C::kAborted,
       "closed", Row::kDataPlane},
      {"data plane: a frame announcing 2^40 bytes",
       [&] { return RawToDataPlane(data_plane, hello_then_huge); }, C::kAborted, "closed",
       Row::kDataPlane},
      {"data plane: text after a valid handshake",
       [&] { return RawToDataPlane(data_plane, hello_then_text); }, C::kAborted, "closed",
       Row::kDataPlane},
      {"data plane: a truncated handshake",
       [&] {
         std::vector<std::byte> hello = dataplane::tcp::EncodeHello("127.0.0.1:9");
         hello.resize(hello.size() / 2);
         return RawToDataPlane(data_plane, hello);
       },
       C::kAborted, "closed", Row::kDataPlane},
  };
  ASSERT_GE(rows.size(), 40u);

  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const absl::Status s = row.input();
    EXPECT_EQ(s.code(), row.code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(row.message)) << s;
    // The process that took the input still serves.
    switch (row.target) {
      case Row::kController: {
        v1::ListNodesResponse now;
        EXPECT_TRUE(controller.ListNodes(Context().get(), {}, &now).ok());
        EXPECT_EQ(now.nodes_size(),
                  kHostileWorkers + kHostileSpares);  // nothing hostile registered
        break;
      }
      case Row::kAgent:
      case Row::kDataPlane: {
        v1::WaitRequest req;
        req.set_session_id(session);
        req.set_handle(1);
        req.set_timeout_ms(1);
        v1::WaitResponse resp;
        const absl::Status alive = common::FromGrpcStatus(agent->Wait(Context().get(), req, &resp));
        EXPECT_NE(alive.code(), absl::StatusCode::kUnavailable) << alive;
        break;
      }
    }
  }

  // The job that lived through all of it: an exact all-reduce on every rank.
  std::vector<std::shared_ptr<client::SharedBuffer>> data;
  std::vector<client::Handle> handles;
  for (int node = 0; node < kHostileWorkers; ++node) {
    auto b = node == 0 ? *buffer : *clients[node]->AllocateBuffer(4096);
    for (size_t i = 0; i < 1024; ++i) b->as<float>()[i] = static_cast<float>((node + 1) * i);
    auto h = clients[node]->AllReduceAsync("after.hostile", *b, 0, 1024, common::DataType::kFloat32,
                                           client::ReduceOp::kSum);
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(*h);
    data.push_back(b);
  }
  for (auto& h : handles) ASSERT_TRUE(h.Wait(60s).ok());
  for (int node = 0; node < kHostileWorkers; ++node) {
    int wrong = 0;
    for (size_t i = 0; i < 1024; ++i) wrong += data[node]->as<float>()[i] != 3.0f * i;
    EXPECT_EQ(wrong, 0) << "node " << node;
  }
  EXPECT_TRUE(cluster_->WaitForAliveNodes(kHostileWorkers + kHostileSpares, 5s).ok());
}

}  // namespace
}  // namespace tributary
