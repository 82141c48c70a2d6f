// mTLS on every gRPC link and the controller's authorization, end to end: certificates made by
// the test with openssl, a real controller and real agents (LocalCluster) started with
// --tls-cert/--tls-key/--tls-ca, clients that must be refused, a certificate replaced on disk
// while the controller runs, and exact all-reduces over the TLS-configured cluster.
#include "common/rpc/tls.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/cluster/local_cluster.h"
#include "gmock/gmock.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "gtest/gtest.h"
#include "tests/util/test_certs.h"

namespace tributary {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kTlsProcsPerNode = 2;

std::string Hostname() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/tributary-tls-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    certs_ = new testing::TestCerts(*dir_);
    ASSERT_TRUE(certs_->MakeCa("ca").ok());
    ASSERT_TRUE(certs_->MakeCa("other-ca").ok());
    ASSERT_TRUE(
        certs_->MakeCert("ca", "controller", "controller", {"DNS:localhost", "IP:127.0.0.1"}).ok());
    for (const std::string node : {"worker-0", "worker-1", "spare-0"}) {
      ASSERT_TRUE(certs_->MakeCert("ca", node, node, {"DNS:" + node, "DNS:" + Hostname()}).ok());
    }
    ASSERT_TRUE(certs_->MakeCert("ca", "admin", "admin", {}).ok());
    ASSERT_TRUE(certs_->MakeCert("ca", "alice", "alice", {"DNS:alice"}).ok());
    // Another CA's certificate claiming to be the admin.
    ASSERT_TRUE(certs_->MakeCert("other-ca", "intruder", "admin", {"DNS:admin"}).ok());
    // A node certificate without this machine's hostname.
    ASSERT_TRUE(certs_->MakeCert("ca", "nohost", "worker-0", {"DNS:worker-0"}).ok());

    client::LocalClusterOptions o;
    o.bin_dir = TRIBUTARY_BIN_DIR;
    o.workers = 2;
    o.spares = 1;
    o.sum_gbps = 4;
    o.heartbeat_timeout = std::chrono::seconds(30);  // no node dies on a loaded machine
    o.tls_dir = *dir_;
    o.tls_reload_seconds = 1;
    auto c = client::LocalCluster::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = c->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    std::error_code ec;
    if (dir_ != nullptr) std::filesystem::remove_all(*dir_, ec);
    delete certs_;
    delete dir_;
  }

  // The TLS files of identity `name` (NAME.crt/.key) trusting the cluster's CA.
  static common::TlsConfig Tls(const std::string& name) {
    common::TlsConfig tls;
    tls.cert = certs_->crt(name);
    tls.key = certs_->key(name);
    tls.ca = certs_->crt("ca");
    tls.reload_seconds = 1;
    return tls;
  }

  static std::unique_ptr<v1::Controller::Stub> Stub(
      std::shared_ptr<grpc::ChannelCredentials> credentials) {
    return v1::Controller::NewStub(
        grpc::CreateChannel(cluster_->controller_address(), std::move(credentials)));
  }
  static std::unique_ptr<v1::Controller::Stub> Stub(const common::TlsConfig& tls) {
    auto channel = common::MakeChannel(cluster_->controller_address(), tls);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return v1::Controller::NewStub(*channel);
  }

  // gRPC's TLS credentials straight from the files, without the checks of MakeChannel (which
  // would refuse a certificate from another CA before the controller could).
  static std::shared_ptr<grpc::ChannelCredentials> RawTls(const std::string& name) {
    grpc::experimental::TlsChannelCredentialsOptions options;
    options.set_certificate_provider(
        std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
            certs_->key(name), certs_->crt(name), certs_->crt("ca"), 1));
    options.watch_root_certs();
    options.watch_identity_key_cert_pairs();
    return grpc::experimental::TlsCredentials(options);
  }

  static std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return ctx;
  }

  static grpc::Status ListNodes(v1::Controller::Stub& stub, v1::ListNodesResponse* resp) {
    auto ctx = Context();
    return stub.ListNodes(ctx.get(), {}, resp);
  }

  static int AliveNodes() {
    v1::ListNodesResponse resp;
    auto ctx = Context();
    if (!cluster_->controller().ListNodes(ctx.get(), {}, &resp).ok()) return -1;
    int alive = 0;
    for (const auto& n : resp.nodes()) alive += n.state() == v1::NODE_STATE_ALIVE;
    return alive;
  }

  static std::string* dir_;
  static testing::TestCerts* certs_;
  static client::LocalCluster* cluster_;
};

std::string* TlsTest::dir_ = nullptr;
testing::TestCerts* TlsTest::certs_ = nullptr;
client::LocalCluster* TlsTest::cluster_ = nullptr;

TEST_F(TlsTest, AllReduceOverTlsIsExact) {
  v1::CreateJobRequest req;
  req.set_job_id("tls-exact");
  for (const std::string& w : cluster_->worker_node_ids()) req.mutable_spec()->add_worker_nodes(w);
  req.mutable_spec()->set_procs_per_node(kTlsProcsPerNode);
  req.mutable_spec()->set_partition_bytes(64 << 10);
  req.mutable_spec()->set_op_timeout_ms(30000);
  req.mutable_spec()->set_algorithm(v1::ALGORITHM_PUSH_PULL);
  v1::Job job;
  {
    auto ctx = Context();
    grpc::Status s = cluster_->controller().CreateJob(ctx.get(), req, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(job.plan().workers_size(), 2);
  std::vector<std::pair<pid_t, std::string>> procs;
  for (int node = 0; node < 2; ++node) {
    for (uint32_t r = 0; r < kTlsProcsPerNode; ++r) {
      const std::string log = absl::StrCat(*dir_, "/worker-", node, "-", r, ".log");
      auto pid = client::SpawnProcess(
          {std::string(TRIBUTARY_BIN_DIR) + "/tributary_test_worker", "--scenario", "exact",
           "--agent", cluster_->agent_address(node), "--job", "tls-exact", "--local-rank",
           std::to_string(r), "--local-size", std::to_string(kTlsProcsPerNode)},
          log);
      ASSERT_TRUE(pid.ok()) << pid.status();
      procs.emplace_back(*pid, log);
    }
  }
  for (auto& [pid, log] : procs) {
    const int code = client::WaitProcess(pid, std::chrono::seconds(120));
    std::ifstream f(log);
    std::stringstream text;
    text << f.rdbuf();
    EXPECT_EQ(code, 0) << log << ":\n" << text.str();
  }
  v1::DeleteJobRequest del;
  del.set_job_id("tls-exact");
  v1::DeleteJobResponse deleted;
  auto ctx = Context();
  EXPECT_TRUE(cluster_->controller().DeleteJob(ctx.get(), del, &deleted).ok());
}

TEST_F(TlsTest, PlaintextClientIsRefused) {
  auto stub = Stub(grpc::InsecureChannelCredentials());
  v1::ListNodesResponse resp;
  grpc::Status s = ListNodes(*stub, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_EQ(resp.nodes_size(), 0);
  EXPECT_EQ(AliveNodes(), 3);  // the controller still serves the cluster
}

TEST_F(TlsTest, ClientWithoutCertificateIsRefused) {
  // Trusts the controller's CA but presents no certificate of its own.
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(
      std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(certs_->crt("ca"), 1));
  options.watch_root_certs();
  auto stub = Stub(grpc::experimental::TlsCredentials(options));
  v1::ListNodesResponse resp;
  grpc::Status s = ListNodes(*stub, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_EQ(resp.nodes_size(), 0);
  EXPECT_EQ(AliveNodes(), 3);
}

TEST_F(TlsTest, CertificateFromAnotherCaIsRefused) {
  // Its CN says "admin", but no CA the controller trusts signed it.
  ASSERT_FALSE(common::MakeChannelCredentials(Tls("intruder")).ok());  // caught client-side too
  auto stub = Stub(RawTls("intruder"));
  v1::CreateJobRequest req;
  req.set_job_id("intruder-job");
  req.mutable_spec()->add_worker_nodes("worker-0");
  req.mutable_spec()->set_procs_per_node(1);
  v1::Job job;
  auto ctx = Context();
  grpc::Status s = stub->CreateJob(ctx.get(), req, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  v1::GetJobRequest get;
  get.set_job_id("intruder-job");
  auto ctx2 = Context();
  EXPECT_EQ(cluster_->controller().GetJob(ctx2.get(), get, &job).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(TlsTest, NodeCertificateActsOnlyForItsOwnNode) {
  auto stub = Stub(Tls("worker-1"));
  v1::RegisterNodeRequest reg;
  reg.set_node_id("worker-0");
  reg.mutable_inventory()->set_hostname(Hostname());
  v1::RegisterNodeResponse registered;
  auto ctx = Context();
  grpc::Status s = stub->RegisterNode(ctx.get(), reg, &registered);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("may not register node \"worker-0\""));
  EXPECT_THAT(s.error_message(), HasSubstr("certificate issued for \"worker-0\""));

  v1::HeartbeatRequest beat;
  beat.set_node_id("worker-0");
  v1::HeartbeatResponse beat_resp;
  auto ctx2 = Context();
  s = stub->Heartbeat(ctx2.get(), beat, &beat_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("may not call Heartbeat for node \"worker-0\""));

  v1::GetAssignmentsRequest get;
  get.set_node_id("worker-0");
  v1::GetAssignmentsResponse assignments;
  auto ctx3 = Context();
  s = stub->GetAssignments(ctx3.get(), get, &assignments);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(assignments.plans_size(), 0);
  EXPECT_EQ(AliveNodes(), 3);
}

TEST_F(TlsTest, NodeCertificateWithoutTheRegisteredHostnameIsRefused) {
  auto stub = Stub(Tls("nohost"));  // names worker-0 but not this machine
  v1::RegisterNodeRequest reg;
  reg.set_node_id("worker-0");
  reg.mutable_inventory()->set_hostname(Hostname());
  v1::RegisterNodeResponse registered;
  auto ctx = Context();
  grpc::Status s = stub->RegisterNode(ctx.get(), reg, &registered);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("with hostname \"", Hostname(), "\"")));
  EXPECT_THAT(s.error_message(), HasSubstr("add it as a DNS SAN"));
  EXPECT_EQ(AliveNodes(), 3);
}

TEST_F(TlsTest, OnlyAdminsCreateAndDeleteJobs) {
  v1::CreateJobRequest req;
  req.set_job_id("alice-job");
  req.mutable_spec()->add_worker_nodes("worker-0");
  req.mutable_spec()->set_procs_per_node(1);
  for (const std::string who : {"alice", "worker-0"}) {
    auto stub = Stub(Tls(who));
    v1::Job job;
    auto ctx = Context();
    grpc::Status s = stub->CreateJob(ctx.get(), req, &job);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << who;
    EXPECT_THAT(s.error_message(), HasSubstr("is not an admin: CreateJob needs"));
    v1::DeleteJobRequest del;
    del.set_job_id("whatever");
    v1::DeleteJobResponse deleted;
    auto ctx2 = Context();
    s = stub->DeleteJob(ctx2.get(), del, &deleted);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << who;
    // Reading is open to every certificate of the cluster.
    v1::ListNodesResponse nodes;
    EXPECT_TRUE(ListNodes(*stub, &nodes).ok()) << who;
    EXPECT_EQ(nodes.nodes_size(), 3);
  }
  v1::GetJobRequest get;
  get.set_job_id("alice-job");
  v1::Job job;
  auto ctx = Context();
  EXPECT_EQ(cluster_->controller().GetJob(ctx.get(), get, &job).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// The controller's certificate renewed on disk (same key, new subject): new connections get
// it within the reload period (1 s here), without a restart; the agents stay connected.
TEST_F(TlsTest, ControllerPicksUpARenewedCertificate) {
  ASSERT_TRUE(certs_
                  ->MakeCert("ca", "controller", "controller-renewed",
                             {"DNS:localhost", "IP:127.0.0.1"}, /*reuse_key=*/true)
                  .ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string seen;
  while (std::chrono::steady_clock::now() < deadline) {
    // A new channel, hence a new connection and handshake, on every attempt.
    auto stub = Stub(Tls("alice"));
    auto ctx = Context();
    v1::ListNodesResponse resp;
    if (stub->ListNodes(ctx.get(), {}, &resp).ok()) {
      auto values = ctx->auth_context()->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
      seen = values.empty() ? "" : std::string(values[0].data(), values[0].size());
      if (seen == "controller-renewed") break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polling, bounded above
  }
  EXPECT_EQ(seen, "controller-renewed");
  EXPECT_EQ(AliveNodes(), 3);
}

// Runs `tributary-run ARGS -- sh -c <a test worker per rank, from the launcher's environment>`
// and returns its exit status and output.
std::pair<int, std::string> RunLauncher(const std::string& dir, std::vector<std::string> args) {
  std::vector<std::string> argv = {std::string(TRIBUTARY_BIN_DIR) + "/tributary-run"};
  argv.insert(argv.end(), args.begin(), args.end());
  for (const std::string& a :
       {std::string("--"), std::string("/bin/sh"), std::string("-c"),
        absl::StrCat("exec ", TRIBUTARY_BIN_DIR,
                     "/tributary_test_worker --scenario exact --agent \"$TRIBUTARY_AGENT_ADDRESS\" "
                     "--job \"$TRIBUTARY_JOB\" --local-rank \"$TRIBUTARY_LOCAL_RANK\" "
                     "--local-size \"$TRIBUTARY_LOCAL_SIZE\"")}) {
    argv.push_back(a);
  }
  static int n = 0;
  const std::string log = absl::StrCat(dir, "/launcher-", n++, ".log");
  auto pid = client::SpawnProcess(argv, log);
  if (!pid.ok()) return {-1, std::string(pid.status().message())};
  const int code = client::WaitProcess(*pid, std::chrono::seconds(120));
  std::ifstream f(log);
  std::stringstream text;
  text << f.rdbuf();
  return {code, text.str()};
}

// tributary-run against the TLS cluster with --controller: an admin's certificate creates the
// job and the ranks' sums are exact; a non-admin's is refused before any rank starts.
TEST_F(TlsTest, TributaryRunWithAnAdminCertificate) {
  std::vector<std::string> common = {
      "--np",         "2",
      "--job",        "launched",
      "--controller", cluster_->controller_address(),
      "--workers",    "worker-0,worker-1",
      "--agents",     cluster_->agent_address(0) + "," + cluster_->agent_address(1),
      "--tls-ca",     certs_->crt("ca")};
  auto with = [&](const std::string& who) {
    std::vector<std::string> args = common;
    for (const std::string& a : {std::string("--tls-cert"), certs_->crt(who),
                                 std::string("--tls-key"), certs_->key(who)}) {
      args.push_back(a);
    }
    return args;
  };
  auto [code, output] = RunLauncher(*dir_, with("admin"));
  EXPECT_EQ(code, 0) << output;
  std::tie(code, output) = RunLauncher(*dir_, with("alice"));
  EXPECT_EQ(code, 1) << output;
  EXPECT_THAT(output, HasSubstr("is not an admin: CreateJob needs"));
  std::tie(code, output) = RunLauncher(*dir_, common);  // no certificate: a half TLS config
  EXPECT_EQ(code, 1) << output;
  EXPECT_THAT(output, HasSubstr("missing: --tls-cert --tls-key"));
}

// tributary-run starting its own local cluster over mTLS (--tls-dir).
TEST_F(TlsTest, TributaryRunStartsALocalClusterOverTls) {
  auto [code, output] = RunLauncher(*dir_, {"--np", "2", "--spares", "1", "--tls-dir", *dir_});
  EXPECT_EQ(code, 0) << output;
}

TEST(TlsConfigTest, BadFilesAreClearErrors) {
  char tmpl[] = "/tmp/tributary-tls-config-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  testing::TestCerts certs(tmpl);
  ASSERT_TRUE(certs.MakeCa("ca").ok());
  ASSERT_TRUE(certs.MakeCa("other-ca").ok());
  ASSERT_TRUE(certs.MakeCert("ca", "a", "a", {}).ok());
  ASSERT_TRUE(certs.MakeCert("ca", "b", "b", {}).ok());
  ASSERT_TRUE(certs.MakeCert("other-ca", "c", "c", {}).ok());
  auto config = [&](const std::string& cert, const std::string& key, const std::string& ca) {
    common::TlsConfig tls;
    tls.cert = cert;
    tls.key = key;
    tls.ca = ca;
    return tls;
  };
  EXPECT_TRUE(common::ValidateTlsConfig({}).ok());  // plaintext
  EXPECT_TRUE(
      common::ValidateTlsConfig(config(certs.crt("a"), certs.key("a"), certs.crt("ca"))).ok());

  absl::Status s = common::ValidateTlsConfig(config(certs.crt("a"), "", ""));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("missing: --tls-key --tls-ca"));

  s = common::ValidateTlsConfig(config(certs.crt("a"), certs.key("a"), "/nonexistent/ca.crt"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--tls-ca /nonexistent/ca.crt: cannot read"));

  s = common::ValidateTlsConfig(config(certs.key("a"), certs.key("a"), certs.crt("ca")));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no PEM certificate"));

  s = common::ValidateTlsConfig(config(certs.crt("a"), certs.crt("a"), certs.crt("ca")));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not a PEM private key"));

  s = common::ValidateTlsConfig(config(certs.crt("a"), certs.key("b"), certs.crt("ca")));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is not the key of the certificate"));

  s = common::ValidateTlsConfig(config(certs.crt("c"), certs.key("c"), certs.crt("ca")));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("does not verify against --tls-ca"));
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
}

}  // namespace
}  // namespace tributary
