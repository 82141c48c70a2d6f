// libFuzzer target: topology::ParseTopologyJson, our JSON topology form. Any input is an error
// Status or a valid topology that survives the JSON and YAML round trip (topology_round_trip.h).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tests/fuzz/topology_round_trip.h"
#include "topology/topology_parsers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  tributary::fuzz::CheckAccepted(tributary::topology::ParseTopologyJson(text, "fuzz"));
  return 0;
}
