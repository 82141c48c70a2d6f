#include "common/rpc/tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace tributary::common {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct StoreFree {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct StoreCtxFree {
  void operator()(X509_STORE_CTX* s) const { X509_STORE_CTX_free(s); }
};
using Cert = std::unique_ptr<X509, X509Free>;

// The reason OpenSSL gives for the last failure (and the error queue emptied).
std::string OpenSslReason() {
  const unsigned long e = ERR_get_error();  // NOLINT: OpenSSL's type
  ERR_clear_error();
  if (e == 0) return "no PEM data";
  char text[256];
  ERR_error_string_n(e, text, sizeof(text));
  return text;
}

absl::StatusOr<File> Open(const std::string& flag, const std::string& path) {
  File f(std::fopen(path.c_str(), "r"));
  if (!f) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": cannot read (", std::strerror(errno), ")"));
  }
  return f;
}

// Every certificate in the PEM file `path`.
absl::StatusOr<std::vector<Cert>> ReadCerts(const std::string& flag, const std::string& path) {
  absl::StatusOr<File> f = Open(flag, path);
  if (!f.ok()) return f.status();
  std::vector<Cert> certs;
  while (X509* x = PEM_read_X509(f->get(), nullptr, nullptr, nullptr)) certs.emplace_back(x);
  ERR_clear_error();  // the end of the file reads as an error
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " ", path, ": no PEM certificate in it (want -----BEGIN CERTIFICATE-----)"));
  }
  return certs;
}

}  // namespace

absl::Status ValidateTlsConfig(const TlsConfig& config) {
  if (!config.enabled()) return absl::OkStatus();
  if (config.cert.empty() || config.key.empty() || config.ca.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mTLS needs all of --tls-cert, --tls-key and --tls-ca; missing:",
                     config.cert.empty() ? " --tls-cert" : "",
                     config.key.empty() ? " --tls-key" : "", config.ca.empty() ? " --tls-ca" : ""));
  }
  if (config.reload_seconds < 1) {
    return absl::InvalidArgumentError("--tls-reload-seconds must be at least 1");
  }
  absl::StatusOr<std::vector<Cert>> chain = ReadCerts("--tls-cert", config.cert);
  if (!chain.ok()) return chain.status();
  absl::StatusOr<std::vector<Cert>> cas = ReadCerts("--tls-ca", config.ca);
  if (!cas.ok()) return cas.status();
  absl::StatusOr<File> key_file = Open("--tls-key", config.key);
  if (!key_file.ok()) return key_file.status();
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_PrivateKey(key_file->get(), nullptr, nullptr, nullptr));
  if (!key) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-key ", config.key,
                                                   ": not a PEM private key (", OpenSslReason(),
                                                   "; an encrypted key is not supported)"));
  }
  if (X509_check_private_key(chain->front().get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-key ", config.key, " is not the key of the certificate in ", config.cert));
  }
  // The certificate must chain to the CA bundle, or every peer will refuse it.
  std::unique_ptr<X509_STORE, StoreFree> store(X509_STORE_new());
  for (const Cert& ca : *cas) X509_STORE_add_cert(store.get(), ca.get());
  STACK_OF(X509)* untrusted = sk_X509_new_null();
  for (size_t i = 1; i < chain->size(); ++i) sk_X509_push(untrusted, (*chain)[i].get());
  std::unique_ptr<X509_STORE_CTX, StoreCtxFree> ctx(X509_STORE_CTX_new());
  X509_STORE_CTX_init(ctx.get(), store.get(), chain->front().get(), untrusted);
  const bool verified = X509_verify_cert(ctx.get()) == 1;
  const int error = X509_STORE_CTX_get_error(ctx.get());
  sk_X509_free(untrusted);
  ERR_clear_error();
  if (!verified) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-cert ", config.cert,
                                                   " does not verify against --tls-ca ", config.ca,
                                                   ": ", X509_verify_cert_error_string(error)));
  }
  return absl::OkStatus();
}

namespace {

std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> Provider(
    const TlsConfig& config) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      config.key, config.cert, config.ca, static_cast<unsigned int>(config.reload_seconds));
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsConfig& config, const std::string& component, const std::string& listen) {
  if (!config.enabled()) {
    Logger(component)->warn(
        "TLS is off (no --tls-cert/--tls-key/--tls-ca): gRPC on {} is plaintext and "
        "unauthenticated, anyone who reaches it can register nodes and create or delete jobs; "
        "use this only on a trusted local network",
        listen);
    return grpc::InsecureServerCredentials();
  }
  if (absl::Status s = ValidateTlsConfig(config); !s.ok()) return s;
  grpc::experimental::TlsServerCredentialsOptions options(Provider(config));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  Logger(component)->info(
      "mTLS on {}: certificate {}, clients verified against {} (files re-read every {} s)", listen,
      config.cert, config.ca, config.reload_seconds);
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsConfig& config) {
  if (!config.enabled()) return grpc::InsecureChannelCredentials();
  if (absl::Status s = ValidateTlsConfig(config); !s.ok()) return s;
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(Provider(config));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);  // chain to the CA, and the name (see server_name)
  return grpc::experimental::TlsCredentials(options);
}

void ApplyTlsChannelArgs(const TlsConfig& config, grpc::ChannelArguments* args) {
  if (config.enabled() && !config.server_name.empty()) {
    args->SetSslTargetNameOverride(config.server_name);
  }
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const TlsConfig& config,
                                                           grpc::ChannelArguments args) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(config);
  if (!credentials.ok()) return credentials.status();
  ApplyTlsChannelArgs(config, &args);
  grpc_channel_args raw = args.c_channel_args();
  bool limited = false;
  for (size_t i = 0; i < raw.num_args; ++i) {
    limited |= std::string_view(raw.args[i].key) == GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  }
  if (!limited) args.SetMaxReceiveMessageSize(kMaxReplyBytes);
  return grpc::CreateCustomChannel(target, *credentials, args);
}

std::vector<std::string> PeerIdentities(const grpc::AuthContext& context) {
  std::vector<std::string> names;
  if (!context.IsPeerAuthenticated()) return names;
  for (const char* property : {GRPC_X509_CN_PROPERTY_NAME, GRPC_PEER_DNS_PROPERTY_NAME}) {
    for (const grpc::string_ref& value : context.FindPropertyValues(property)) {
      std::string name(value.data(), value.size());
      if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) {
        names.push_back(std::move(name));
      }
    }
  }
  return names;
}

}  // namespace tributary::common
