// libFuzzer target: the bundling transport's unpacker (dataplane/transport/bundling/), behind
// the data plane's header decoder, as a received message travels: the inner transport hands
// BundlingTransport a message; a bundle ("TRBN" header) is checked whole and each record goes to
// the handler, which parses it with ParseHeader as DataPlaneNode does.
// Input: one byte choosing the header length (0..Transport::kMaxHeaderBytes), the header, the
// payload. The handler must only ever see spans inside the message.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "dataplane/collectives/wire.h"
#include "dataplane/transport/bundling/bundling_transport.h"
#include "spdlog/spdlog.h"

namespace {

using namespace tributary::dataplane;

// The inner transport: keeps the handler BundlingTransport installs so that the fuzzer can call
// it as a transport's progress thread would.
class CapturingTransport final : public Transport {
 public:
  std::string Address() const override { return "fuzz:0"; }
  void SetReceiveHandler(ReceiveHandler handler) override { handler_ = std::move(handler); }
  void Send(const std::string&, std::span<const std::byte>, std::span<const std::byte>,
            SendCallback done) override {
    done(absl::OkStatus());
  }
  void Shutdown() override {}
  ReceiveHandler handler_;
};

struct Fixture {
  CapturingTransport* inner = nullptr;
  std::unique_ptr<BundlingTransport> bundling;
  std::span<const std::byte> message;  // the current input, for the bounds check
};

Fixture& GetFixture() {
  static Fixture* f = [] {
    spdlog::set_level(spdlog::level::off);  // malformed bundles are logged: keep the fuzzer fast
    auto* fixture = new Fixture;
    auto inner = std::make_unique<CapturingTransport>();
    fixture->inner = inner.get();
    fixture->bundling = std::make_unique<BundlingTransport>(std::move(inner), BundlingOptions{});
    fixture->bundling->SetReceiveHandler(
        [fixture](std::span<const std::byte> header, std::span<const std::byte> payload) {
          const auto* begin = fixture->message.data();
          const auto* end = begin + fixture->message.size();
          for (auto s : {header, payload}) {
            if (!s.empty() && (s.data() < begin || s.data() + s.size() > end)) __builtin_trap();
          }
          if (header.size() > Transport::kMaxHeaderBytes) __builtin_trap();
          (void)ParseHeader(header, payload.size());
        });
    return fixture;
  }();
  return *f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Fixture& f = GetFixture();
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  const size_t header_bytes =
      std::min<size_t>(data[0] % (Transport::kMaxHeaderBytes + 1), size - 1);
  f.message = {bytes + 1, size - 1};
  f.inner->handler_({bytes + 1, header_bytes}, {bytes + 1 + header_bytes, size - 1 - header_bytes});
  return 0;
}
