// LoadDeltas: a heartbeat carries the node's measured load only when it moved beyond the
// tolerance since the load the controller took, or every `refresh` heartbeats; job observations
// and membership changes always travel; an unanswered heartbeat or a new registration makes the
// next one whole.
#include "agent/load_delta.h"

#include "gtest/gtest.h"

namespace tributary::agent {
namespace {

tributary::v1::NodeLoad Load(double cpu, double nic_tx, uint64_t memory = 8ull << 30) {
  tributary::v1::NodeLoad load;
  load.set_cpu_busy_fraction(cpu);
  load.set_nic_tx_bytes_per_s(nic_tx);
  load.set_nic_rx_bytes_per_s(nic_tx / 2);
  load.set_dataplane_tx_bytes_per_s(nic_tx / 4);
  load.set_dataplane_rx_bytes_per_s(nic_tx / 8);
  load.set_memory_used_bytes(memory);
  return load;
}

// Registered with a controller that takes load deltas.
LoadDeltas Registered(LoadDeltas::Options options = {}) {
  LoadDeltas deltas(options);
  deltas.Reset(/*deltas=*/true);
  return deltas;
}

// Fills and answers one heartbeat; returns it.
tributary::v1::HeartbeatRequest Beat(LoadDeltas& deltas, const tributary::v1::NodeLoad& load,
                                     bool answered = true) {
  tributary::v1::HeartbeatRequest hb;
  deltas.Fill(load, &hb);
  deltas.Answered(answered);
  return hb;
}

TEST(LoadDeltasTest, TheFirstHeartbeatCarriesTheLoadAndAStillLoadIsNotSentAgain) {
  LoadDeltas deltas = Registered();
  const auto first = Beat(deltas, Load(0.5, 100e6));
  EXPECT_FALSE(first.load_unchanged());
  EXPECT_DOUBLE_EQ(first.load().cpu_busy_fraction(), 0.5);
  EXPECT_EQ(first.load().memory_used_bytes(), 8ull << 30);
  // Within the tolerance: 1 % of the CPU, 2 % of the NIC rate, 32 MiB of memory.
  const auto second = Beat(deltas, Load(0.51, 102e6, (8ull << 30) + (32 << 20)));
  EXPECT_TRUE(second.load_unchanged());
  EXPECT_EQ(second.load().cpu_busy_fraction(), 0);
  EXPECT_EQ(second.load().nic_tx_bytes_per_s(), 0);
  EXPECT_LT(second.ByteSizeLong(), first.ByteSizeLong());
}

TEST(LoadDeltasTest, EachFigureThatMovesSendsTheWholeLoad) {
  const tributary::v1::NodeLoad base = Load(0.5, 100e6);
  auto moved = [&](auto change) {
    LoadDeltas deltas = Registered();
    Beat(deltas, base);
    tributary::v1::NodeLoad now = base;
    change(now);
    return !Beat(deltas, now).load_unchanged();
  };
  EXPECT_TRUE(moved([](auto& l) { l.set_cpu_busy_fraction(0.53); }));
  EXPECT_TRUE(moved([](auto& l) { l.set_nic_tx_bytes_per_s(106e6); }));
  EXPECT_TRUE(moved([](auto& l) { l.set_nic_rx_bytes_per_s(44e6); }));
  EXPECT_TRUE(moved([](auto& l) { l.set_dataplane_tx_bytes_per_s(27e6); }));
  EXPECT_TRUE(moved([](auto& l) { l.set_dataplane_rx_bytes_per_s(14e6); }));
  EXPECT_TRUE(moved([](auto& l) { l.set_memory_used_bytes((9ull << 30)); }));
  EXPECT_FALSE(moved([](auto& l) { l.set_nic_tx_bytes_per_s(104e6); }));
  // Small rates jitter: below the 1 MB/s floor nothing counts as moved.
  LoadDeltas deltas = Registered();
  Beat(deltas, Load(0.1, 1000));
  EXPECT_TRUE(Beat(deltas, Load(0.1, 900e3)).load_unchanged());
}

TEST(LoadDeltasTest, DriftIsMeasuredFromWhatTheControllerHolds) {
  LoadDeltas deltas = Registered();
  Beat(deltas, Load(0.5, 100e6));
  EXPECT_TRUE(Beat(deltas, Load(0.5, 103e6)).load_unchanged());
  EXPECT_TRUE(Beat(deltas, Load(0.5, 104e6)).load_unchanged());
  // 6 % from the 100 MB/s the controller holds, though 2 % from the last measurement.
  const auto hb = Beat(deltas, Load(0.5, 106e6));
  EXPECT_FALSE(hb.load_unchanged());
  EXPECT_DOUBLE_EQ(hb.load().nic_tx_bytes_per_s(), 106e6);
}

TEST(LoadDeltasTest, TheLoadTravelsEveryRefreshHeartbeats) {
  LoadDeltas deltas = Registered({.refresh = 4});
  int whole = 0;
  for (int i = 0; i < 12; ++i) whole += Beat(deltas, Load(0.5, 100e6)).load_unchanged() ? 0 : 1;
  EXPECT_EQ(whole, 3);
}

TEST(LoadDeltasTest, AnUnansweredHeartbeatOrANewRegistrationMakesTheNextOneWhole) {
  LoadDeltas deltas = Registered();
  Beat(deltas, Load(0.5, 100e6));
  Beat(deltas, Load(0.5, 100e6), /*answered=*/false);
  EXPECT_FALSE(Beat(deltas, Load(0.5, 100e6)).load_unchanged());
  EXPECT_TRUE(Beat(deltas, Load(0.5, 100e6)).load_unchanged());
  deltas.Reset(true);
  EXPECT_FALSE(Beat(deltas, Load(0.5, 100e6)).load_unchanged());
  // A whole load that was not answered is not taken as held.
  LoadDeltas lost = Registered();
  Beat(lost, Load(0.5, 100e6), /*answered=*/false);
  EXPECT_FALSE(Beat(lost, Load(0.5, 100e6)).load_unchanged());
}

TEST(LoadDeltasTest, AControllerThatTakesNoDeltasGetsTheWholeLoadEveryTime) {
  LoadDeltas never;  // not registered yet
  EXPECT_FALSE(Beat(never, Load(0.5, 100e6)).load_unchanged());
  EXPECT_FALSE(Beat(never, Load(0.5, 100e6)).load_unchanged());
  LoadDeltas old = Registered();
  old.Reset(/*deltas=*/false);  // registered again, with a controller from before load deltas
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(Beat(old, Load(0.5, 100e6)).load_unchanged());
}

TEST(LoadDeltasTest, ObservationsAndMembershipChangesAlwaysTravel) {
  LoadDeltas deltas = Registered();
  Beat(deltas, Load(0.5, 100e6));
  tributary::v1::NodeLoad now = Load(0.5, 100e6);
  now.add_jobs()->set_job_id("j");
  tributary::v1::MembershipChange* change = now.add_membership_changes();
  change->set_job_id("j");
  change->set_generation(2);
  const auto hb = Beat(deltas, now);
  EXPECT_TRUE(hb.load_unchanged());
  ASSERT_EQ(hb.load().jobs_size(), 1);
  EXPECT_EQ(hb.load().jobs(0).job_id(), "j");
  ASSERT_EQ(hb.load().membership_changes_size(), 1);
  EXPECT_EQ(hb.load().membership_changes(0).generation(), 2u);
}

}  // namespace
}  // namespace tributary::agent
