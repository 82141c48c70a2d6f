#include "agent/load_delta.h"

#include <algorithm>
#include <cmath>

namespace tributary::agent {
namespace {

bool Differs(double held, double now, double relative, double floor) {
  return std::abs(now - held) > std::max(floor, relative * std::abs(held));
}

}  // namespace

bool LoadDeltas::Moved(const tributary::v1::NodeLoad& held,
                       const tributary::v1::NodeLoad& now) const {
  const double r = options_.relative, rate = options_.bytes_per_s;
  return std::abs(now.cpu_busy_fraction() - held.cpu_busy_fraction()) > options_.cpu_fraction ||
         Differs(held.nic_tx_bytes_per_s(), now.nic_tx_bytes_per_s(), r, rate) ||
         Differs(held.nic_rx_bytes_per_s(), now.nic_rx_bytes_per_s(), r, rate) ||
         Differs(held.dataplane_tx_bytes_per_s(), now.dataplane_tx_bytes_per_s(), r, rate) ||
         Differs(held.dataplane_rx_bytes_per_s(), now.dataplane_rx_bytes_per_s(), r, rate) ||
         Differs(static_cast<double>(held.memory_used_bytes()),
                 static_cast<double>(now.memory_used_bytes()), r, options_.memory_bytes);
}

void LoadDeltas::Fill(tributary::v1::NodeLoad load, tributary::v1::HeartbeatRequest* hb) {
  if (deltas_ && held_.has_value() && since_full_ + 1 < options_.refresh && !Moved(*held_, load)) {
    ++since_full_;
    hb->set_load_unchanged(true);
    tributary::v1::NodeLoad* out = hb->mutable_load();
    out->mutable_jobs()->Swap(load.mutable_jobs());
    out->mutable_membership_changes()->Swap(load.mutable_membership_changes());
    pending_.reset();
    return;
  }
  *hb->mutable_load() = load;
  load.clear_jobs();
  load.clear_membership_changes();
  pending_ = std::move(load);
}

void LoadDeltas::Answered(bool ok) {
  if (!ok) {
    held_.reset();  // unknown: the next one is whole
    pending_.reset();
    return;
  }
  if (pending_.has_value()) {
    held_ = std::move(pending_);
    pending_.reset();
    since_full_ = 0;
  }
}

}  // namespace tributary::agent
