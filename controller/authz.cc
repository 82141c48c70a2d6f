#include "controller/authz.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/rpc/tls.h"

namespace tributary::controller {
namespace {

constexpr auto Log = common::ComponentLog<"controller">;

// "certificate worker-1 (CN/SAN: worker-1, host-a)" for messages.
std::string Describe(const Caller& caller) {
  return absl::StrCat("client certificate ", caller.names.front(), " (names ",
                      absl::StrJoin(caller.names, ", "), ")");
}

absl::Status Denied(std::string message) {
  Log()->warn("denied: {}", message);
  return absl::PermissionDeniedError(std::move(message));
}

}  // namespace

Caller Authorizer::CallerOf(const grpc::ServerContextBase& ctx) {
  Caller caller;
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return caller;
  caller.authenticated = true;
  caller.names = common::PeerIdentities(*auth);
  return caller;
}

absl::Status Authorizer::Authenticated(const Caller& caller, absl::string_view method) const {
  if (!caller.authenticated) {
    return absl::UnauthenticatedError(absl::StrCat(
        method,
        ": this controller requires mTLS; present a client certificate signed by its CA "
        "(--tls-cert, --tls-key, --tls-ca)"));
  }
  if (caller.names.empty()) {
    return Denied(absl::StrCat(method,
                               ": the client certificate names nobody (no CN, no DNS SAN); "
                               "issue one whose CN names the node or the admin"));
  }
  return absl::OkStatus();
}

bool Authorizer::Names(const Caller& caller, absl::string_view name) const {
  return std::find(caller.names.begin(), caller.names.end(), name) != caller.names.end();
}

bool Authorizer::IsFleet(const Caller& caller) const {
  return std::any_of(options_.fleet.begin(), options_.fleet.end(),
                     [&](const std::string& f) { return Names(caller, f); });
}

absl::Status Authorizer::RegisterNode(const Caller& caller,
                                      const v1::RegisterNodeRequest& request) const {
  if (!options_.tls) return absl::OkStatus();
  if (absl::Status s = Authenticated(caller, "RegisterNode"); !s.ok()) return s;
  if (IsFleet(caller)) return absl::OkStatus();
  if (!Names(caller, request.node_id())) {
    return Denied(absl::StrCat(
        Describe(caller), " may not register node \"", request.node_id(),
        "\": an agent registers only the node its certificate names (CN or DNS SAN); use a "
        "certificate issued for \"",
        request.node_id(), "\", or start the agent with --node-id set to the certificate's name"));
  }
  const std::string& hostname = request.inventory().hostname();
  if (!hostname.empty() && !Names(caller, hostname)) {
    return Denied(absl::StrCat(Describe(caller), " may not register node \"", request.node_id(),
                               "\" with hostname \"", hostname,
                               "\": the certificate must also name the node's hostname (add it "
                               "as a DNS SAN)"));
  }
  return absl::OkStatus();
}

absl::Status Authorizer::ActForNode(const Caller& caller, absl::string_view node_id,
                                    absl::string_view method) const {
  if (!options_.tls) return absl::OkStatus();
  if (absl::Status s = Authenticated(caller, method); !s.ok()) return s;
  if (IsFleet(caller) || Names(caller, node_id)) return absl::OkStatus();
  return Denied(absl::StrCat(Describe(caller), " may not call ", method, " for node \"", node_id,
                             "\": an agent acts only for the node its certificate names"));
}

absl::Status Authorizer::Admin(const Caller& caller, absl::string_view method) const {
  if (!options_.tls) return absl::OkStatus();
  if (absl::Status s = Authenticated(caller, method); !s.ok()) return s;
  if (options_.admins.empty()) {
    return Denied(absl::StrCat(method,
                               " needs an admin, and this controller has none: start it with "
                               "--tls-admin NAME (the CN or a DNS SAN of the admins' client "
                               "certificate)"));
  }
  for (const std::string& admin : options_.admins) {
    if (Names(caller, admin)) return absl::OkStatus();
  }
  return Denied(absl::StrCat(Describe(caller), " is not an admin: ", method,
                             " needs a client certificate naming one of the controller's "
                             "--tls-admin identities"));
}

absl::Status Authorizer::Read(const Caller& caller, absl::string_view method) const {
  if (!options_.tls) return absl::OkStatus();
  return Authenticated(caller, method);
}

}  // namespace tributary::controller
