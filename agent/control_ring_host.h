// The agent's end of the control rings (the fast path, common/shm_ring.h): training processes
// push collectives into a shared-memory submission queue instead of calling Submit, and read
// results from a completion queue, with futex doorbells rung only when the other side sleeps.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "agent/local_service.h"
#include "common/shm_ring.h"
#include "tributary/v1/agent.pb.h"

namespace tributary::agent {

// Serves every attached control ring, one thread per ring. A ring's thread polls the ring for
// a moment when its recent idle spells were short (Options::spin), else sleeps on the
// submission doorbell (at most `idle_wake`, so that a stop is never missed), copies each entry
// out of the shared memory before looking at it, checks it, and hands it to
// LocalService::SubmitWithCallback — the validation and gather path of Submit. Results are
// written to the completion queue by whichever thread completes the operation (the data plane's,
// or the ring thread for refused entries), and the client's doorbell is rung only when it
// sleeps. Results that do not fit a full completion queue wait here, in order, and go out as
// the client frees slots (it rings the submission doorbell when the header's cq_blocked is
// set). A ring whose counters leave their range (a corrupt or hostile client) ends its session
// with a logged error; the agent and the other sessions go on.
//
// Lifetime: a ring lives as long as its session (LocalService::WatchSession stops it). Threads
// of rings whose session ended are joined at the next Attach and at Shutdown.
// Threading: every method is thread-safe. Lock order: the rings' mutex is never held while
// calling the service.
class ControlRings {
 public:
  struct Options {
    // Longest sleep of a ring thread before it looks at its stop flag again.
    std::chrono::milliseconds idle_wake{100};
    // Ring submissions of one session accepted and not yet written to its completion queue;
    // past it the thread stops taking entries until results go out.
    size_t max_in_flight = 65536;
    // Before sleeping on the submission doorbell, a ring thread whose recent idle spells were
    // shorter than this polls the ring for up to this long (common/shm_ring.h SpinPolicy);
    // zero: always sleep at once.
    std::chrono::microseconds spin = common::shm_ring::kDefaultSpin;
    // Tests: runs on a ring thread at its in-flight bound, after its last look at the queues and
    // before it reads the doorbell to sleep on (where a client's ring can fall).
    std::function<void()> before_throttled_sleep;
  };

  // `service` must outlive this object.
  explicit ControlRings(LocalService* service) : ControlRings(service, Options{}) {}
  ControlRings(LocalService* service, Options options);
  ControlRings(const ControlRings&) = delete;
  ControlRings& operator=(const ControlRings&) = delete;
  ~ControlRings();

  // Maps the session's ring object, checks its header (common/shm_ring.h ReadHeader) and starts
  // serving it. INVALID_ARGUMENT (bad name, size or header), NOT_FOUND (no such shared-memory
  // object or session), ALREADY_EXISTS (the session has a ring), UNAVAILABLE after Shutdown.
  absl::Status Attach(const tributary::v1::AttachControlRingRequest& req,
                      tributary::v1::AttachControlRingResponse* resp);
  // Submits, on the calling thread, every entry the session's ring holds (none: returns). The
  // Submit RPC calls it first: a client falls back to the RPC when its ring is full, and a
  // submission of the same tensor name must not overtake one still in the ring (the agent
  // numbers a name's iterations in the order its submissions reach the service; swapped, the
  // ranks would pair different regions).
  void DrainSubmissions(const std::string& session_id);
  // Stops and joins every ring thread; later attaches fail with UNAVAILABLE. Idempotent.
  void Shutdown();
  // Rings still being served (their session has not ended).
  size_t num_active() const;

 private:
  class Host;

  // Joins the threads of rings that stopped. mu_ held.
  void ReapLocked();

  LocalService* const service_;
  const Options options_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Host>> hosts_;  // by session id; guarded by mu_
  bool shut_down_ = false;                              // guarded by mu_
};

}  // namespace tributary::agent
