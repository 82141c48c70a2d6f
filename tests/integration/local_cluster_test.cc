// End to end: a controller, 3 worker agents with 2 training processes each and 2 spare
// summation agents, all real processes talking real gRPC and a real data plane over loopback
// (the agents' default transport, TCP under ctest's UCX_TLS=tcp; LocalClusterUcxTest: UCX).
#include "client/cluster/local_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <span>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/unix_fd.h"
#include "dataplane/collectives/operation.h"
#include "dataplane/collectives/wire.h"
#include "dataplane/transport/tcp/tcp_transport.h"
#include "dataplane/transport/tcp/tcp_wire.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace tributary {
namespace {

constexpr int kLocalWorkers = 3;
constexpr int kLocalSpares = 2;
constexpr uint32_t kLocalProcsPerNode = 2;

struct WorkerResult {
  int exit_code;
  std::string output;
};

class LocalClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { StartCluster(""); }
  // `transport`: the agents' --transport (empty: their default).
  static void StartCluster(const std::string& transport) {
    client::LocalClusterOptions o;
    o.transport = transport;
    o.bin_dir = TRIBUTARY_BIN_DIR;
    o.workers = kLocalWorkers;
    o.spares = kLocalSpares;
    o.nic_gbps = {10};
    o.sum_gbps = 4;  // declared, so that plans do not depend on a start-up measurement
    // Long enough that no node is declared dead (and no job re-planned) while a test runs on a
    // loaded machine; node death is covered by the controller's unit tests.
    o.heartbeat_timeout = std::chrono::seconds(30);
    auto c = client::LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  // Jobs hold spare capacity while they exist: each test deletes its own.
  void TearDown() override {
    if (job_id_.empty()) return;
    tributary::v1::DeleteJobRequest req;
    req.set_job_id(job_id_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    tributary::v1::DeleteJobResponse resp;
    EXPECT_TRUE(cluster_->controller().DeleteJob(&ctx, req, &resp).ok());
  }

  // A job over the first `workers` worker nodes (and every spare).
  void CreateJob(const std::string& id, uint32_t timeout_ms = 30000,
                 tributary::v1::Algorithm algorithm = tributary::v1::ALGORITHM_PUSH_PULL,
                 int workers = kLocalWorkers) {
    job_id_ = id;
    tributary::v1::CreateJobRequest req;
    req.set_job_id(id);
    for (int w = 0; w < workers; ++w) {
      req.mutable_spec()->add_worker_nodes(cluster_->worker_node_ids()[w]);
    }
    req.mutable_spec()->set_procs_per_node(kLocalProcsPerNode);
    req.mutable_spec()->set_partition_bytes(64 << 10);  // many chunks per tensor
    req.mutable_spec()->set_credit_bytes(256 << 10);
    req.mutable_spec()->set_op_timeout_ms(timeout_ms);
    req.mutable_spec()->set_algorithm(algorithm);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    tributary::v1::Job job;
    grpc::Status s = cluster_->controller().CreateJob(&ctx, req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(job.plan().workers_size(), workers);
    if (workers == kLocalWorkers) {
      ASSERT_EQ(job.plan().servers_size(), workers + kLocalSpares);  // the spares own shares too
    } else {
      ASSERT_GE(job.plan().servers_size(), workers);  // the planner uses spares where they help
    }
  }

  // Runs one test worker per (node, local rank) and collects their exit codes and output.
  std::vector<WorkerResult> RunWorkers(const std::string& job, const std::string& scenario,
                                       std::vector<std::string> extra = {},
                                       int workers = kLocalWorkers) {
    extra.insert(extra.begin(), {"--scenario", scenario});
    return RunProcesses(std::string(TRIBUTARY_BIN_DIR) + "/tributary_test_worker", {}, job, extra,
                        workers);
  }

  // Runs `program [prefix...] --agent A --job J --local-rank r --local-size R [extra...]` once per
  // (node, local rank) of the first `workers` nodes, in rank order.
  std::vector<WorkerResult> RunProcesses(const std::string& program,
                                         const std::vector<std::string>& prefix,
                                         const std::string& job,
                                         const std::vector<std::string>& extra,
                                         int workers = kLocalWorkers) {
    std::vector<std::pair<pid_t, std::string>> procs;
    for (int node = 0; node < workers; ++node) {
      for (uint32_t r = 0; r < kLocalProcsPerNode; ++r) {
        std::vector<std::string> argv = {program};
        argv.insert(argv.end(), prefix.begin(), prefix.end());
        for (const std::string& a :
             {std::string("--agent"), cluster_->agent_address(node), std::string("--job"), job,
              std::string("--local-rank"), std::to_string(r), std::string("--local-size"),
              std::to_string(kLocalProcsPerNode)}) {
          argv.push_back(a);
        }
        argv.insert(argv.end(), extra.begin(), extra.end());
        const std::string log =
            absl::StrCat(cluster_->run_dir(), "/", job, "-", node, "-", r, ".log");
        auto pid = client::SpawnProcess(argv, log);
        EXPECT_TRUE(pid.ok());
        if (pid.ok()) procs.emplace_back(*pid, log);
      }
    }
    std::vector<WorkerResult> results;
    for (auto& [pid, log] : procs) {
      const int code = client::WaitProcess(pid, std::chrono::seconds(120));
      std::ifstream f(log);
      std::stringstream ss;
      ss << f.rdbuf();
      results.push_back({code, ss.str()});
    }
    return results;
  }

  static void ExpectAllPassed(const std::vector<WorkerResult>& results) {
    for (size_t i = 0; i < results.size(); ++i) {
      EXPECT_EQ(results[i].exit_code, 0) << "process " << i << ":\n" << results[i].output;
    }
  }

  static client::LocalCluster* cluster_;
  std::string job_id_;
};

client::LocalCluster* LocalClusterTest::cluster_ = nullptr;

TEST_F(LocalClusterTest, ExactSumsAveragesAndBroadcastsForEveryDtype) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("exact"));
  ExpectAllPassed(RunWorkers("exact", "exact"));
}

TEST_F(LocalClusterTest, RingJobIsExactForEveryDtype) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("ring", 30000, tributary::v1::ALGORITHM_RING));
  ExpectAllPassed(RunWorkers("ring", "exact"));
}

TEST_F(LocalClusterTest, HalvingDoublingJobIsExactForEveryDtype) {
  // Its broadcasts fall back to the ring's: halving-doubling declines them.
  ASSERT_NO_FATAL_FAILURE(CreateJob("hd", 30000, tributary::v1::ALGORITHM_HALVING_DOUBLING));
  ExpectAllPassed(RunWorkers("hd", "exact"));
}

// All-gather and reduce-scatter (sum, average) in push/pull jobs: they run on the workers' ring
// whatever the job's algorithm (the spares take no part), every element checked, and mismatches
// under one name fail every process. Two agents x 2 processes (the cluster's spares stay idle:
// the planner gives them no share of a 2-node job), then three (not a power of two) with both
// spares holding shares of the job's all-reduces.
TEST_F(LocalClusterTest, AllGatherAndReduceScatterInAPushPullJobOfTwoNodes) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("gather2", 30000, tributary::v1::ALGORITHM_PUSH_PULL, 2));
  ExpectAllPassed(RunWorkers("gather2", "gather-scatter", {}, 2));
}

TEST_F(LocalClusterTest, AllGatherAndReduceScatterInAPushPullJobWithSpares) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("gather3"));
  ExpectAllPassed(RunWorkers("gather3", "gather-scatter"));
}

// `tributary bench-rank --op allgather|reduce-scatter`, each in a job of its own (a job's ranks
// that left fail the gathers they miss until a new process takes their place).
TEST_F(LocalClusterTest, BenchRankRunsAllGatherAndReduceScatter) {
  for (const std::string op : {"allgather", "reduce-scatter"}) {
    ASSERT_NO_FATAL_FAILURE(CreateJob("bench-" + op));
    auto results =
        RunProcesses(std::string(TRIBUTARY_BIN_DIR) + "/tributary", {"bench-rank"}, "bench-" + op,
                     {"--op", op, "--sizes", "1K,1M", "--iters", "2", "--warmup", "1", "--csv",
                      "--log-level", "warn"});
    ExpectAllPassed(results);
    ASSERT_FALSE(results.empty());
    // Rank 0's table: 1 KiB is 256 float32 = 6 blocks of 42 (1008 bytes); no wrong element.
    EXPECT_THAT(results[0].output, ::testing::HasSubstr("CSV,1008,252,float32," + op + ","));
    EXPECT_THAT(results[0].output, ::testing::HasSubstr("Out of bounds values : 0 OK"));
    TearDown();  // deletes this job
    job_id_.clear();
  }
}

TEST_F(LocalClusterTest, HundredIterationsOfSeveralTensorsAgreeOnEveryRank) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("iterations"));
  auto results = RunWorkers("iterations", "iterations", {"--iterations", "100"});
  ExpectAllPassed(results);
  std::set<std::string> digests;
  const std::regex re("digest=([0-9a-f]+)");
  for (const auto& r : results) {
    std::smatch m;
    if (std::regex_search(r.output, m, re)) digests.insert(m[1]);
  }
  EXPECT_EQ(digests.size(), 1u) << "ranks ended with different results";
}

TEST_F(LocalClusterTest, MismatchedSizesAndDtypesFailEveryParticipant) {
  ASSERT_NO_FATAL_FAILURE(
      CreateJob("mismatch", /*timeout_ms=*/120000));  // any error must come long before this
  ExpectAllPassed(RunWorkers("mismatch", "mismatch"));
}

TEST_F(LocalClusterTest, BadInputGetsClearErrorsAndLosesNothing) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("bad-input"));
  ExpectAllPassed(RunWorkers("bad-input", "bad-input"));
  // A job this node does not know.
  auto pid =
      client::SpawnProcess({std::string(TRIBUTARY_BIN_DIR) + "/tributary_test_worker", "--agent",
                            cluster_->agent_address(0), "--job", "x", "--local-rank", "0",
                            "--local-size", "2", "--scenario", "unknown-job"},
                           cluster_->run_dir() + "/unknown-job.log");
  ASSERT_TRUE(pid.ok());
  EXPECT_EQ(client::WaitProcess(*pid, std::chrono::seconds(30)), 0);
}

TEST_F(LocalClusterTest, MalformedDataPlaneMessagesAreDroppedAndServiceContinues) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("malformed"));
  tributary::v1::ListNodesResponse nodes;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ASSERT_TRUE(cluster_->controller().ListNodes(&ctx, {}, &nodes).ok());
  }
  auto transport = dataplane::TcpTransport::Create({});
  ASSERT_TRUE(transport.ok()) << transport.status();
  dataplane::WireHeader h;
  h.kind = static_cast<uint8_t>(dataplane::MessageKind::kPush);
  h.dtype = 1;
  h.reduce = 1;
  h.job = 12345;
  h.tensor_count = 1000;
  h.num_chunks = 1;
  h.chunk_count = 1000;
  const std::vector<std::byte> garbage(40, std::byte{0x7f});
  const std::vector<std::byte> truncated(100);  // 1000 floats announced, 25 sent
  std::atomic<int> sent{0};
  for (const auto& n : nodes.nodes()) {
    const std::string addr = n.inventory().data_plane_address();
    (*transport)->Send(addr, garbage, {}, [&](absl::Status) { sent++; });
    (*transport)->Send(addr, dataplane::AsBytes(h), truncated, [&](absl::Status) { sent++; });
    (*transport)->Send(addr, std::span(dataplane::AsBytes(h).data(), 10), {}, [&](absl::Status) {
      sent++;
    });
  }
  ExpectAllPassed(RunWorkers("malformed", "iterations", {"--iterations", "3"}));
  (*transport)->Shutdown();
  EXPECT_TRUE(
      cluster_->WaitForAliveNodes(kLocalWorkers + kLocalSpares, std::chrono::seconds(5)).ok());
}

// Issue 13: bytes that are not the protocol on an agent's data-plane port (UCX's TCP stack
// aborted the process on 16 bytes of 0xff) close that connection only; every agent stays up and
// the next all-reduces are exact.
TEST_F(LocalClusterTest, HostileBytesOnDataPlanePortsLeaveEveryAgentServing) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("hostile"));
  tributary::v1::ListNodesResponse nodes;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ASSERT_TRUE(cluster_->controller().ListNodes(&ctx, {}, &nodes).ok());
  }
  ASSERT_EQ(nodes.nodes_size(), kLocalWorkers + kLocalSpares);
  auto bytes = [](const std::string& text) {
    std::vector<std::byte> out(text.size());
    std::memcpy(out.data(), text.data(), text.size());
    return out;
  };
  auto concat = [](std::vector<std::byte> a, const std::vector<std::byte>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  std::vector<std::byte> huge_frame(dataplane::tcp::kFrameHeaderBytes);
  dataplane::tcp::EncodeFrameHeader({.payload_length = uint64_t{1} << 40}, huge_frame.data());
  const std::vector<std::byte> hello = dataplane::tcp::EncodeHello("127.0.0.1:9");
  std::vector<std::vector<std::byte>> inputs = {
      std::vector<std::byte>(16, std::byte{0xff}),
      std::vector<std::byte>(4096, std::byte{0}),
      bytes("GET /metrics HTTP/1.1\r\n\r\n"),
      concat(hello, huge_frame),
      concat(hello, bytes("garbage after a valid handshake")),
  };
  std::mt19937_64 random(13);
  for (int i = 0; i < 20; ++i) {
    std::vector<std::byte> noise(1 + random() % 512);
    for (std::byte& b : noise) b = std::byte(random() & 0xff);
    inputs.push_back(i % 2 == 0 ? noise : concat(hello, noise));
  }
  for (const auto& n : nodes.nodes()) {
    const std::string addr = n.inventory().data_plane_address();
    const uint16_t port = static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1)));
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      sa.sin_port = htons(port);
      ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0) << addr;
      timeval timeout{.tv_sec = 10, .tv_usec = 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
      send(fd, inputs[i].data(), inputs[i].size(), MSG_NOSIGNAL);
      shutdown(fd, SHUT_WR);
      // The agent closes the connection (EOF or reset); a deadline bounds a failing test.
      std::byte scratch[256];
      ssize_t r;
      while ((r = recv(fd, scratch, sizeof(scratch), 0)) > 0) {
      }
      EXPECT_TRUE(r == 0 || errno == ECONNRESET) << addr << " input " << i << ": " << r;
      close(fd);
    }
  }
  ExpectAllPassed(RunWorkers("hostile", "iterations", {"--iterations", "3"}));
  EXPECT_TRUE(
      cluster_->WaitForAliveNodes(kLocalWorkers + kLocalSpares, std::chrono::seconds(5)).ok());
}

// Issue 13, job tokens: a peer that can reach the data-plane ports but does not hold the job's
// secret (GetJob never shows it) sends well-formed pushes for the job's real tensors, iterations
// and epoch, with a forged MAC, to every node. They are dropped (never summed): the workers'
// all-reduces of those very tensors and iterations stay exact.
TEST_F(LocalClusterTest, PushesWithoutTheJobSecretAreNeverSummed) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("forged"));
  tributary::v1::Job job;
  tributary::v1::ListNodesResponse nodes;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    tributary::v1::GetJobRequest req;
    req.set_job_id("forged");
    ASSERT_TRUE(cluster_->controller().GetJob(&ctx, req, &job).ok());
    grpc::ClientContext list_ctx;
    list_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ASSERT_TRUE(cluster_->controller().ListNodes(&list_ctx, {}, &nodes).ok());
  }
  EXPECT_TRUE(job.plan().job_secret().empty()) << "GetJob must not reveal the job's secret";
  auto transport = dataplane::TcpTransport::Create({});
  ASSERT_TRUE(transport.ok()) << transport.status();
  std::mutex mu;
  std::condition_variable cv;
  int done = 0, sends = 0;
  std::vector<float> poison(4099, 1e6f);
  for (const auto& n : nodes.nodes()) {
    for (uint32_t sender = 0; sender < kLocalWorkers; ++sender) {
      for (uint64_t iteration = 0; iteration < 3; ++iteration) {
        dataplane::WireHeader h;
        h.kind = static_cast<uint8_t>(dataplane::MessageKind::kPush);
        h.dtype = static_cast<uint8_t>(common::DataType::kFloat32);
        h.reduce = static_cast<uint8_t>(dataplane::Reduction::kSum);
        h.algorithm = static_cast<uint8_t>(dataplane::Algorithm::kPushPull);
        h.job = common::StableHash64("forged");
        h.tensor = common::StableHash64("layer1.grad");
        h.iteration = iteration;
        h.plan_version = job.plan().version();
        h.tensor_count = 4099;
        h.num_chunks = 1;
        h.chunk_count = 4099;
        h.sender = sender;
        std::memset(h.mac, 0xa5, sizeof(h.mac));
        (*transport)
            ->Send(n.inventory().data_plane_address(), dataplane::AsBytes(h),
                   std::as_bytes(std::span(poison)), [&](absl::Status) {
                     std::lock_guard lock(mu);
                     ++done;
                     cv.notify_all();
                   });
        ++sends;
      }
    }
  }
  {
    std::unique_lock lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return done == sends; }));
  }
  ExpectAllPassed(RunWorkers("forged", "iterations", {"--iterations", "3"}));
  (*transport)->Shutdown();
  EXPECT_TRUE(
      cluster_->WaitForAliveNodes(kLocalWorkers + kLocalSpares, std::chrono::seconds(5)).ok());
}

TEST_F(LocalClusterTest, ProcessThatDisconnectsFailsItsPeersPromptly) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("disconnect", /*timeout_ms=*/120000));
  auto results = RunWorkers("disconnect", "disconnect");
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i].exit_code, i == 1 ? 3 : 0) << "process " << i << ":\n"
                                                    << results[i].output;
  }
}

// Every process connects, then all submit together (a FIFO barrier: a process that started late
// on a loaded machine could otherwise submit after its node-mate had already hit the deadline
// and left the job) and get DEADLINE_EXCEEDED. The op deadline stays under the data plane's
// connect timeout, which would make the failure retriable and re-plan the spare away.
TEST_F(LocalClusterTest, FrozenSummationServerBecomesADeadlineError) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("frozen", /*timeout_ms=*/3000));
  const std::string signal = absl::StrCat(cluster_->run_dir(), "/frozen-signal");
  const std::string go = absl::StrCat(cluster_->run_dir(), "/frozen-go");
  ASSERT_EQ(mkfifo(signal.c_str(), 0600), 0);
  ASSERT_EQ(mkfifo(go.c_str(), 0600), 0);
  // Both held open to read and write: the processes' opens do not block, and their reads of the
  // go FIFO never see an end of file.
  common::UniqueFd signal_fd(open(signal.c_str(), O_RDWR | O_CLOEXEC));
  common::UniqueFd go_fd(open(go.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_GE(signal_fd.get(), 0);
  ASSERT_GE(go_fd.get(), 0);
  const int processes = kLocalWorkers * kLocalProcsPerNode;

  cluster_->FreezeNode(kLocalWorkers);  // spare-0
  std::vector<WorkerResult> results;
  std::thread run([&] {
    results = RunWorkers("frozen", "timeout", {"--signal-fifo", signal, "--go-fifo", go});
  });
  int signalled = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (signalled < processes && std::chrono::steady_clock::now() < deadline) {
    pollfd p{signal_fd.get(), POLLIN, 0};
    if (poll(&p, 1, 1000) != 1) continue;
    char b[8];
    const ssize_t n = read(signal_fd.get(), b, sizeof(b));
    if (n > 0) signalled += static_cast<int>(n);
  }
  EXPECT_EQ(signalled, processes) << "not every process connected within 60 s";
  const std::string bytes(processes, 'g');  // releases those that did, even on failure
  EXPECT_EQ(write(go_fd.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  run.join();
  cluster_->ThawNode(kLocalWorkers);
  ExpectAllPassed(results);
}

// A model-shaped iteration through `tributary bench-rank --tensors`: tensors of very different
// sizes (1 element to several chunks), all submitted at once with priorities, every element
// checked on every rank.
TEST_F(LocalClusterTest, ModelWorkloadWithPrioritiesIsExact) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("workload"));
  const std::string path = absl::StrCat(cluster_->run_dir(), "/mini.tensors");
  {
    std::ofstream f(path);
    f << "# backward order\nfc.bias 10\nfc.weight 5000\nblock2.bn 64\nblock2.conv 300000\n"
         "block1.bn 64\nblock1.conv 70000\nconv1.bias 1\nconv1.weight 9408\n";
  }
  auto results =
      RunProcesses(std::string(TRIBUTARY_BIN_DIR) + "/tributary", {"bench-rank"}, "workload",
                   {"--tensors", path, "--workload-name", "mini", "--iters", "3", "--warmup", "1",
                    "--log-level", "warn"});
  ExpectAllPassed(results);
  ASSERT_FALSE(results.empty());
  // Global rank 0 reports: 8 tensors, 384547 float32 elements, no wrong element.
  EXPECT_THAT(results[0].output, ::testing::HasSubstr("WCSV,mini,8,1538188,"));
  EXPECT_THAT(results[0].output,
              ::testing::MatchesRegex("(.|\n)*WCSV,mini,8,1538188,[0-9.]+,0\n(.|\n)*"));
  // Each iteration's time (the warm-up first), and the timed iterations' steady-clock window,
  // in which the emulated-cluster suite meters CPU.
  EXPECT_THAT(results[0].output,
              ::testing::MatchesRegex(
                  "(.|\n)*# mini iterations \\(ms, 1 warm-up first\\):( [0-9.e+]+){4}\n(.|\n)*"));
  EXPECT_THAT(results[0].output,
              ::testing::MatchesRegex("(.|\n)*WTIMED,[0-9]+\\.[0-9]+,[0-9]+\\.[0-9]+\n(.|\n)*"));
}

// The same iteration in DDP-style buckets (`--bucket-bytes`): the tensors packed in file order
// into buckets of at most 400000 bytes, a larger tensor alone -- fc.* and block2.bn (20296
// bytes), block2.conv (1.2 MB), block1.* and conv1.* (317892 bytes) -- one all-reduce each,
// every element checked. Without --tensors the flag is an error.
TEST_F(LocalClusterTest, ModelWorkloadInBucketsIsExact) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("buckets"));
  const std::string path = absl::StrCat(cluster_->run_dir(), "/buckets.tensors");
  {
    std::ofstream f(path);
    f << "fc.bias 10\nfc.weight 5000\nblock2.bn 64\nblock2.conv 300000\n"
         "block1.bn 64\nblock1.conv 70000\nconv1.bias 1\nconv1.weight 9408\n";
  }
  auto results =
      RunProcesses(std::string(TRIBUTARY_BIN_DIR) + "/tributary", {"bench-rank"}, "buckets",
                   {"--tensors", path, "--workload-name", "mini", "--bucket-bytes", "400000",
                    "--iters", "3", "--warmup", "1", "--log-level", "warn"});
  ExpectAllPassed(results);
  ASSERT_FALSE(results.empty());
  EXPECT_THAT(results[0].output, ::testing::HasSubstr("# mini: 8 tensors in 3 buckets, 1538188 "));
  EXPECT_THAT(results[0].output,
              ::testing::MatchesRegex("(.|\n)*WCSV,mini,8,1538188,[0-9.]+,0\n(.|\n)*"));

  const std::string log = path + ".no-tensors.log";
  auto pid = client::SpawnProcess({std::string(TRIBUTARY_BIN_DIR) + "/tributary", "bench-rank",
                                   "--agent", cluster_->agent_address(0), "--job", "buckets",
                                   "--bucket-bytes", "400000", "--join-timeout-ms", "2000"},
                                  log);
  ASSERT_TRUE(pid.ok());
  EXPECT_NE(client::WaitProcess(*pid, std::chrono::seconds(60)), 0);
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_THAT(ss.str(), ::testing::HasSubstr("--bucket-bytes packs the tensors of --tensors"));
}

// `bench-rank --trace` on a workload: each process's Chrome trace has its iterations and
// submissions, and a span per tensor unless --no-trace-tensors.
TEST_F(LocalClusterTest, WorkloadTraceHasTensorSpansUnlessTurnedOff) {
  const std::string path = absl::StrCat(cluster_->run_dir(), "/traced.tensors");
  {
    std::ofstream f(path);
    f << "head.bias 10\nhead.weight 5000\nstem.weight 300\n";
  }
  // Every trace the job's processes wrote, concatenated, and how many there were.
  auto traces = [&](const std::string& job) {
    std::string all;
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(cluster_->run_dir())) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("trace-" + job + "-", 0) != 0) continue;
      std::ifstream f(entry.path());
      std::stringstream ss;
      ss << f.rdbuf();
      all += ss.str();
      files++;
    }
    return std::make_pair(all, files);
  };
  for (const bool per_tensor : {true, false}) {
    const std::string job = per_tensor ? "traced" : "traced-iterations";
    ASSERT_NO_FATAL_FAILURE(CreateJob(job));
    std::vector<std::string> args = {
        "--tensors",       path,
        "--workload-name", "mini",
        "--iters",         "2",
        "--warmup",        "0",
        "--trace",         absl::StrCat(cluster_->run_dir(), "/trace-", job, "-{pid}.json"),
        "--log-level",     "warn"};
    if (!per_tensor) args.push_back("--no-trace-tensors");
    auto results =
        RunProcesses(std::string(TRIBUTARY_BIN_DIR) + "/tributary", {"bench-rank"}, job, args);
    ExpectAllPassed(results);
    const auto [trace, files] = traces(job);
    EXPECT_EQ(files, static_cast<int>(results.size())) << job;
    EXPECT_THAT(trace, ::testing::HasSubstr("\"submissions\"")) << job;
    EXPECT_THAT(trace, ::testing::HasSubstr("mini iteration 1")) << job;
    if (per_tensor) {
      EXPECT_THAT(trace, ::testing::HasSubstr("\"head.weight\"")) << job;
    } else {
      EXPECT_THAT(trace, ::testing::Not(::testing::HasSubstr("head.weight"))) << job;
    }
    TearDown();  // deletes this job
    job_id_.clear();
  }
}

TEST_F(LocalClusterTest, WorkloadFileErrorsNameTheLine) {
  const std::string path = absl::StrCat(cluster_->run_dir(), "/bad.tensors");
  {
    std::ofstream f(path);
    f << "ok 4\nbroken -3\n";
  }
  auto pid =
      client::SpawnProcess({std::string(TRIBUTARY_BIN_DIR) + "/tributary", "bench-rank", "--agent",
                            cluster_->agent_address(0), "--job", "bad-workload", "--local-size",
                            "2", "--tensors", path, "--join-timeout-ms", "2000"},
                           path + ".log");
  ASSERT_TRUE(pid.ok());
  EXPECT_NE(client::WaitProcess(*pid, std::chrono::seconds(60)), 0);
  std::ifstream f(path + ".log");
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_THAT(ss.str(), ::testing::HasSubstr("bad.tensors:2: expected \"name count\""));
}

}  // namespace
}  // namespace tributary

namespace tributary {
namespace {

// The same cluster on the UCX transport (--transport ucx), the one RDMA networks use.
class LocalClusterUcxTest : public LocalClusterTest {
 protected:
  static void SetUpTestSuite() { StartCluster("ucx"); }
};

TEST_F(LocalClusterUcxTest, ExactSumsAveragesAndBroadcastsForEveryDtype) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("ucx-exact"));
  ExpectAllPassed(RunWorkers("ucx-exact", "exact"));
}

TEST_F(LocalClusterUcxTest, RingJobIsExactForEveryDtype) {
  ASSERT_NO_FATAL_FAILURE(CreateJob("ucx-ring", 30000, tributary::v1::ALGORITHM_RING));
  ExpectAllPassed(RunWorkers("ucx-ring", "exact"));
}

}  // namespace
}  // namespace tributary
