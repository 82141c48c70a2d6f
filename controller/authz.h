// Who may call what on the controller, decided from the caller's verified client certificate
// (mTLS, common/rpc/tls.h). Without TLS every call is allowed, as before.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "tributary/v1/controller.pb.h"

namespace tributary::controller {

struct AuthzOptions {
  // The controller serves mTLS: callers are known by their certificate. False: plaintext, and
  // every call is allowed (local clusters).
  bool tls = false;
  // Identities (a certificate's CN or one of its DNS SANs) allowed the admin calls CreateJob
  // and DeleteJob (--tls-admin).
  std::vector<std::string> admins;
  // Identities that may act for any node (--tls-fleet-identity): for deployments whose agents
  // share one certificate, e.g. a Kubernetes DaemonSet mounting one Secret. Weaker than a
  // certificate per node: one agent's key can then speak for every node.
  std::vector<std::string> fleet;
};

// The caller of one RPC as the TLS handshake established it.
struct Caller {
  bool authenticated = false;      // a client certificate was presented and verified
  std::vector<std::string> names;  // its CN and DNS SANs
};

// The rules, one method per kind of call; each returns OK, UNAUTHENTICATED (TLS on and no
// verified certificate) or PERMISSION_DENIED with a message saying which certificate was
// refused and what would be accepted. A node is its node id: the agent's certificate must name
// it (and the hostname it registers) in its CN or a DNS SAN. Stateless and thread-safe.
class Authorizer {
 public:
  explicit Authorizer(AuthzOptions options) : options_(std::move(options)) {}

  // The caller behind `ctx` (its auth context's verified peer identities).
  static Caller CallerOf(const grpc::ServerContextBase& ctx);

  // RegisterNode: the certificate names the node id and the inventory's hostname (or is a
  // fleet identity).
  absl::Status RegisterNode(const Caller& caller, const v1::RegisterNodeRequest& request) const;
  // Heartbeat, GetAssignments: an agent acts only for its own node.
  absl::Status ActForNode(const Caller& caller, absl::string_view node_id,
                          absl::string_view method) const;
  // CreateJob, DeleteJob: an admin identity.
  absl::Status Admin(const Caller& caller, absl::string_view method) const;
  // ListNodes, GetJob, ListJobs: any verified certificate.
  absl::Status Read(const Caller& caller, absl::string_view method) const;

  // The same, for a handler's context (one line at the top of each handler).
  absl::Status RegisterNode(const grpc::ServerContextBase& ctx,
                            const v1::RegisterNodeRequest& request) const {
    return options_.tls ? RegisterNode(CallerOf(ctx), request) : absl::OkStatus();
  }
  absl::Status ActForNode(const grpc::ServerContextBase& ctx, absl::string_view node_id,
                          absl::string_view method) const {
    return options_.tls ? ActForNode(CallerOf(ctx), node_id, method) : absl::OkStatus();
  }
  absl::Status Admin(const grpc::ServerContextBase& ctx, absl::string_view method) const {
    return options_.tls ? Admin(CallerOf(ctx), method) : absl::OkStatus();
  }
  absl::Status Read(const grpc::ServerContextBase& ctx, absl::string_view method) const {
    return options_.tls ? Read(CallerOf(ctx), method) : absl::OkStatus();
  }

  const AuthzOptions& options() const { return options_; }

 private:
  // UNAUTHENTICATED unless the caller presented a verified certificate that names something.
  absl::Status Authenticated(const Caller& caller, absl::string_view method) const;
  bool Names(const Caller& caller, absl::string_view name) const;
  bool IsFleet(const Caller& caller) const;

  AuthzOptions options_;
};

}  // namespace tributary::controller
