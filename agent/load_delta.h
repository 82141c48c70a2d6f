// Heartbeats stay small: a node's measured load (CPU, NIC, data-plane rates, memory) travels only
// when it moved since the load the controller last took, or every `refresh` heartbeats; otherwise
// the heartbeat says `load_unchanged` and the controller keeps what it has. Per-job observations
// and membership changes are deltas already and always travel.
#pragma once

#include <cstdint>
#include <optional>

#include "tributary/v1/controller.pb.h"

namespace tributary::agent {

class LoadDeltas {
 public:
  struct Options {
    // A rate or memory figure moved when it changed by more than this fraction of the value the
    // controller holds, or by more than the absolute floor below (small values jitter).
    double relative = 0.05;
    double cpu_fraction = 0.02;              // cpu_busy_fraction, absolute
    double bytes_per_s = 1e6;                // NIC and data-plane rates, absolute floor
    double memory_bytes = 64.0 * (1 << 20);  // memory_used_bytes, absolute floor
    // The load travels at least every this many heartbeats, moved or not.
    uint32_t refresh = 10;
  };

  LoadDeltas() : LoadDeltas(Options{}) {}
  explicit LoadDeltas(Options options) : options_(options) {}

  // Puts `load` into `hb`, or only its jobs and membership changes with load_unchanged.
  void Fill(tributary::v1::NodeLoad load, tributary::v1::HeartbeatRequest* hb);
  // The controller answered the heartbeat Fill made (ok), or did not: then what it holds is
  // unknown, and the next heartbeat carries the whole load.
  void Answered(bool ok);
  // A new registration (a new incarnation): the controller holds no load of the node. Without
  // `deltas` (RegisterNodeResponse.takes_load_deltas false) every heartbeat carries it whole.
  void Reset(bool deltas) {
    held_.reset();
    pending_.reset();
    deltas_ = deltas;
  }

 private:
  bool Moved(const tributary::v1::NodeLoad& held, const tributary::v1::NodeLoad& now) const;

  const Options options_;
  std::optional<tributary::v1::NodeLoad> held_;     // the measured fields the controller took
  std::optional<tributary::v1::NodeLoad> pending_;  // sent in full, not answered yet
  uint32_t since_full_ = 0;
  bool deltas_ = false;  // until a controller that takes them answers a registration
};

}  // namespace tributary::agent
