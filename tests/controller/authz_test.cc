// The controller's authorization rules on callers as the TLS handshake describes them (the
// handshake itself is tests/integration/tls_test.cc's).
#include "controller/authz.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tributary::controller {
namespace {

using ::testing::HasSubstr;

Caller Cert(std::vector<std::string> names) { return Caller{true, std::move(names)}; }

v1::RegisterNodeRequest Registration(const std::string& node, const std::string& host) {
  v1::RegisterNodeRequest r;
  r.set_node_id(node);
  r.mutable_inventory()->set_hostname(host);
  return r;
}

TEST(AuthzTest, WithoutTlsEverythingIsAllowed) {
  const Authorizer authz(AuthzOptions{});
  const Caller anonymous;
  EXPECT_TRUE(authz.RegisterNode(anonymous, Registration("n1", "h1")).ok());
  EXPECT_TRUE(authz.ActForNode(anonymous, "n1", "Heartbeat").ok());
  EXPECT_TRUE(authz.Admin(anonymous, "CreateJob").ok());
  EXPECT_TRUE(authz.Read(anonymous, "ListNodes").ok());
}

TEST(AuthzTest, WithTlsAnUnauthenticatedCallerIsRefused) {
  const Authorizer authz(AuthzOptions{.tls = true, .admins = {"admin"}});
  const Caller anonymous;
  absl::Status s = authz.Read(anonymous, "ListNodes");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(s.message(), HasSubstr("ListNodes: this controller requires mTLS"));
  EXPECT_EQ(authz.Admin(anonymous, "CreateJob").code(), absl::StatusCode::kUnauthenticated);
  // A verified certificate that names nobody.
  s = authz.ActForNode(Cert({}), "n1", "Heartbeat");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("names nobody"));
}

TEST(AuthzTest, ANodeRegistersAndActsOnlyAsItself) {
  const Authorizer authz(AuthzOptions{.tls = true});
  const Caller n1 = Cert({"n1", "h1"});
  EXPECT_TRUE(authz.RegisterNode(n1, Registration("n1", "h1")).ok());
  EXPECT_TRUE(authz.RegisterNode(n1, Registration("n1", "")).ok());
  EXPECT_TRUE(authz.ActForNode(n1, "n1", "Heartbeat").ok());
  // The node id may be named by any of the certificate's names (here the hostname).
  EXPECT_TRUE(authz.RegisterNode(n1, Registration("h1", "h1")).ok());

  absl::Status s = authz.RegisterNode(n1, Registration("n2", "h1"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("client certificate n1 (names n1, h1) may not register "
                                     "node \"n2\""));
  s = authz.RegisterNode(n1, Registration("n1", "h2"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("with hostname \"h2\""));
  s = authz.ActForNode(n1, "n2", "GetAssignments");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("may not call GetAssignments for node \"n2\""));
  // A node is no admin.
  EXPECT_EQ(authz.Admin(n1, "CreateJob").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(authz.Read(n1, "ListJobs").ok());
}

TEST(AuthzTest, AFleetIdentityActsForEveryNodeButIsNoAdmin) {
  const Authorizer authz(AuthzOptions{.tls = true, .admins = {"ops"}, .fleet = {"agents"}});
  const Caller fleet = Cert({"agents"});
  EXPECT_TRUE(authz.RegisterNode(fleet, Registration("n7", "h7")).ok());
  EXPECT_TRUE(authz.ActForNode(fleet, "n7", "Heartbeat").ok());
  EXPECT_EQ(authz.Admin(fleet, "DeleteJob").code(), absl::StatusCode::kPermissionDenied);
}

TEST(AuthzTest, AdminCallsNeedAConfiguredAdmin) {
  const Authorizer none(AuthzOptions{.tls = true});
  absl::Status s = none.Admin(Cert({"ops"}), "CreateJob");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("start it with --tls-admin NAME"));

  const Authorizer authz(AuthzOptions{.tls = true, .admins = {"ops", "root"}});
  EXPECT_TRUE(authz.Admin(Cert({"x", "root"}), "DeleteJob").ok());
  s = authz.Admin(Cert({"alice"}), "DeleteJob");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("client certificate alice (names alice) is not an admin: "
                                     "DeleteJob needs"));
  EXPECT_EQ(authz.ActForNode(Cert({"ops"}), "n1", "Heartbeat").code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace tributary::controller
