// Certificates for mTLS tests, made with the `openssl` command: CAs and leaf certificates
// (ECDSA P-256, valid two days) in a folder, as NAME.crt / NAME.key.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tributary::testing {

class TestCerts {
 public:
  explicit TestCerts(std::string dir) : dir_(std::move(dir)) {}

  const std::string& dir() const { return dir_; }
  std::string crt(const std::string& name) const { return absl::StrCat(dir_, "/", name, ".crt"); }
  std::string key(const std::string& name) const { return absl::StrCat(dir_, "/", name, ".key"); }

  // A self-signed CA NAME.crt / NAME.key with subject CN=`name`.
  absl::Status MakeCa(const std::string& name) const {
    return Run(absl::StrCat(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2",
        " -subj /CN=", name, " -keyout ", key(name), " -out ", crt(name),
        " -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign"));
  }

  // NAME.crt signed by CA `ca` with subject CN=`cn` and the subject alternative names `sans`
  // ("DNS:x", "IP:127.0.0.1"), usable as server and client certificate. With `reuse_key`, signs
  // the existing NAME.key again (a renewed certificate for the same key).
  absl::Status MakeCert(const std::string& ca, const std::string& name, const std::string& cn,
                        const std::vector<std::string>& sans, bool reuse_key = false) const {
    const std::string ext = absl::StrCat(dir_, "/", name, ".ext");
    {
      std::ofstream f(ext);
      f << "basicConstraints=CA:FALSE\n"
        << "keyUsage=critical,digitalSignature,keyEncipherment\n"
        << "extendedKeyUsage=serverAuth,clientAuth\n";
      if (!sans.empty()) f << "subjectAltName=" << absl::StrJoin(sans, ",") << "\n";
    }
    const std::string csr = absl::StrCat(dir_, "/", name, ".csr");
    const std::string new_key =
        reuse_key ? absl::StrCat("-key ", key(name))
                  : absl::StrCat("-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ",
                                 key(name));
    if (absl::Status s =
            Run(absl::StrCat("openssl req -new ", new_key, " -subj /CN=", cn, " -out ", csr));
        !s.ok()) {
      return s;
    }
    // Written next to the final name and renamed, so a watcher never reads half a file.
    const std::string tmp = crt(name) + ".tmp";
    if (absl::Status s =
            Run(absl::StrCat("openssl x509 -req -in ", csr, " -CA ", crt(ca), " -CAkey ", key(ca),
                             " -CAcreateserial -days 2", " -extfile ", ext, " -out ", tmp));
        !s.ok()) {
      return s;
    }
    if (std::rename(tmp.c_str(), crt(name).c_str()) != 0) {
      return absl::InternalError(absl::StrCat("rename ", tmp));
    }
    return absl::OkStatus();
  }

 private:
  static absl::Status Run(const std::string& command) {
    const int rc = std::system((command + " >/dev/null 2>&1").c_str());
    if (rc != 0) return absl::InternalError(absl::StrCat("failed (", rc, "): ", command));
    return absl::OkStatus();
  }

  std::string dir_;
};

}  // namespace tributary::testing
