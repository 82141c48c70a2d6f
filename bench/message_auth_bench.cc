// Cost of authenticating one data-plane header (dataplane/collectives/message_auth.h): HMAC-SHA256
// of the 120-byte WireHeader under the job's secret, the work every message pays twice (the
// sender's Sign, the receiver's Verify).
//
// Rows, interleaved within each repetition, best repetition reported:
//  * HeaderMac::Sign: the hash states after the key's pad blocks kept, copied per message;
//  * EVP_MAC, keyed once: what HeaderMac did until session 31 (a keyed context restarted with
//    EVP_MAC_init(ctx, nullptr, ...) per message, which duplicates provider contexts);
//  * one-shot HMAC(): OpenSSL's HMAC() per message (hashes the key's pads every time).
//
// Flags: --headers N (headers per timed pass; default 200000), --reps N (default 5).
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "dataplane/collectives/message_auth.h"
#include "dataplane/collectives/wire.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // HMAC(), as old callers used it

namespace tributary::dataplane {
namespace {

// Keeps a result alive past the optimiser.
volatile uint8_t g_sink = 0;

WireHeader Header(uint64_t i) {
  WireHeader h{};
  h.kind = static_cast<uint8_t>(MessageKind::kPush);
  h.job = 0x1234;
  h.tensor = 0x5678 + (i & 255);
  h.iteration = i;
  h.chunk = static_cast<uint32_t>(i % 64);
  h.chunk_count = 1024;
  return h;
}

double NsPerHeader(const std::function<void(uint64_t)>& one, uint64_t headers) {
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < headers; ++i) one(i);
  const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
  return took.count() / static_cast<double>(headers);
}

int Main(int argc, char** argv) {
  uint64_t headers = 200000;
  int reps = 5;
  CLI::App app{"HMAC-SHA256 of one data-plane header: HeaderMac against OpenSSL's other ways"};
  app.add_option("--headers", headers, "headers per timed pass")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 32))
      ->capture_default_str();
  app.add_option("--reps", reps, "timed passes per method, best one reported")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const std::string secret(32, 's');  // a job secret's length (controller: 32 random bytes)

  absl::StatusOr<std::shared_ptr<const HeaderMac>> mac = HeaderMac::Create(secret);
  if (!mac.ok()) {
    std::fprintf(stderr, "HeaderMac::Create: %s\n", std::string(mac.status().message()).c_str());
    return 1;
  }
  EVP_MAC* hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  EVP_MAC_CTX* keyed = hmac != nullptr ? EVP_MAC_CTX_new(hmac) : nullptr;
  char digest_name[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest_name, 0),
                               OSSL_PARAM_END};
  if (keyed == nullptr || EVP_MAC_init(keyed, reinterpret_cast<const unsigned char*>(secret.data()),
                                       secret.size(), params) != 1) {
    std::fprintf(stderr, "OpenSSL could not key EVP_MAC HMAC-SHA256\n");
    return 1;
  }

  struct Row {
    const char* name;
    std::function<void(uint64_t)> one;
    double best = 1e300;
  };
  std::vector<Row> rows;
  rows.push_back({"HeaderMac::Sign (pad states copied)", [&](uint64_t i) {
                    WireHeader h = Header(i);
                    (*mac)->Sign(h);
                    g_sink = g_sink ^ h.mac[0];
                  }});
  rows.push_back({"EVP_MAC keyed once, re-initialised", [&](uint64_t i) {
                    WireHeader h = Header(i);
                    unsigned char out[EVP_MAX_MD_SIZE];
                    size_t length = 0;
                    EVP_MAC_init(keyed, nullptr, 0, nullptr);
                    EVP_MAC_update(keyed, reinterpret_cast<const unsigned char*>(&h), sizeof(h));
                    EVP_MAC_final(keyed, out, &length, sizeof(out));
                    g_sink = g_sink ^ out[0];
                  }});
  rows.push_back({"one-shot HMAC()", [&](uint64_t i) {
                    WireHeader h = Header(i);
                    unsigned char out[EVP_MAX_MD_SIZE];
                    unsigned int length = 0;
                    HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
                         reinterpret_cast<const unsigned char*>(&h), sizeof(h), out, &length);
                    g_sink = g_sink ^ out[0];
                  }});
  for (int r = 0; r < reps; ++r) {
    for (Row& row : rows) row.best = std::min(row.best, NsPerHeader(row.one, headers));
  }
  EVP_MAC_CTX_free(keyed);
  EVP_MAC_free(hmac);

  std::printf("# HMAC-SHA256 of one %zu-byte WireHeader, %llu headers per pass, best of %d\n",
              sizeof(WireHeader), static_cast<unsigned long long>(headers), reps);
  std::printf("| method | ns per header | x HeaderMac |\n|---|---:|---:|\n");
  for (const Row& row : rows) {
    std::printf("| %s | %.0f | %.2fx |\n", row.name, row.best, row.best / rows[0].best);
  }
  return 0;
}

}  // namespace
}  // namespace tributary::dataplane

int main(int argc, char** argv) { return tributary::dataplane::Main(argc, argv); }
