// What the network transports (TCP, UCX) share around their progress thread: the hand-off of
// sends from any thread to it, the receive handler that other threads may replace, and the
// checks every send gets before it is queued.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "dataplane/transport/socket_address.h"
#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

// The header limit and a numeric peer address: the checks a send gets on the caller's thread,
// before it is queued (a failure completes the send without touching the network).
inline absl::StatusOr<SocketAddress> CheckSendTarget(const std::string& peer_address,
                                                     std::span<const std::byte> header) {
  if (header.size() > Transport::kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("send to ", peer_address, ": header of ",
                                                   header.size(), " bytes exceeds the limit of ",
                                                   Transport::kMaxHeaderBytes));
  }
  return ParsePeerAddress(peer_address);
}

// The status of a send that the transport's shutdown cancelled.
inline absl::Status SendCancelled(const std::string& address) {
  return absl::CancelledError(absl::StrCat("send to ", address, " cancelled: transport shut down"));
}

// The receive handler; replaced from any thread, called on the progress thread without a lock
// held (a replaced handler finishes its current call).
class ReceiveHandlerSlot {
 public:
  void Set(Transport::ReceiveHandler handler) {
    auto shared = std::make_shared<const Transport::ReceiveHandler>(std::move(handler));
    std::lock_guard lock(mu_);
    handler_ = std::move(shared);
  }
  // Null until Set.
  std::shared_ptr<const Transport::ReceiveHandler> Get() const {
    std::lock_guard lock(mu_);
    return handler_;
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const Transport::ReceiveHandler> handler_;  // Guarded by mu_.
};

// Sends (`Op`s) on their way from any thread to the progress thread, and the stop request.
// A send made on the progress thread itself (from a handler or a completion) goes to a local
// queue the loop posts next, so the thread never waits on itself. Once the progress thread has
// seen the stop request (Take) or torn down (Close), the queue is closed: Push hands the op back
// to the caller, who fails it with SendCancelled, since no progress thread is left to do so.
template <typename Op>
class SendQueue {
 public:
  enum class Pushed {
    kQueued,      // The progress thread will post it.
    kQueuedWake,  // Likewise, and the caller must wake the thread (the queue was empty).
    kClosed,      // Not queued: `op` is still the caller's.
  };

  // Progress thread, at its start and end.
  void SetProgressThread() { progress_thread_.store(std::this_thread::get_id()); }
  void ClearProgressThread() { progress_thread_.store(std::thread::id()); }
  bool OnProgressThread() const { return progress_thread_.load() == std::this_thread::get_id(); }

  // Any thread. Moves from `op` unless the result is kClosed.
  Pushed Push(std::unique_ptr<Op>& op) {
    if (OnProgressThread()) {
      local_.push_back(std::move(op));
      return Pushed::kQueued;
    }
    std::lock_guard lock(mu_);
    if (closed_) return Pushed::kClosed;
    const bool wake = queue_.empty();
    queue_.push_back(std::move(op));
    return wake ? Pushed::kQueuedWake : Pushed::kQueued;
  }

  // Push, and what its result asks of the caller: `wake()` the progress thread when it must be
  // woken; returns the op when the queue is closed (to fail it with SendCancelled), else null.
  template <typename WakeFn>
  std::unique_ptr<Op> Hand(std::unique_ptr<Op> op, WakeFn wake) {
    switch (Push(op)) {
      case Pushed::kQueuedWake:
        wake();
        return nullptr;
      case Pushed::kQueued:
        return nullptr;
      case Pushed::kClosed:
        return op;
    }
    return op;
  }

  // Any thread: the progress thread sees the request at its next Take.
  void RequestStop() {
    std::lock_guard lock(mu_);
    stop_requested_ = true;
  }

  // Progress thread: what other threads queued since the last call. `*stop` becomes true once a
  // stop was requested; the queue is closed from then on.
  std::vector<std::unique_ptr<Op>> Take(bool* stop) {
    std::vector<std::unique_ptr<Op>> ops;
    std::lock_guard lock(mu_);
    ops.swap(queue_);
    if (stop_requested_) {
      closed_ = true;
      *stop = true;
    }
    return ops;
  }

  // Progress thread, at teardown: closes the queue and returns what is left in it.
  std::vector<std::unique_ptr<Op>> Close() {
    std::vector<std::unique_ptr<Op>> ops;
    std::lock_guard lock(mu_);
    closed_ = true;
    ops.swap(queue_);
    return ops;
  }

  // Progress thread: the oldest send made on the progress thread; null when there is none.
  std::unique_ptr<Op> PopLocal() {
    if (local_.empty()) return nullptr;
    std::unique_ptr<Op> op = std::move(local_.front());
    local_.pop_front();
    return op;
  }
  bool local_empty() const { return local_.empty(); }

 private:
  std::atomic<std::thread::id> progress_thread_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Op>> queue_;  // Guarded by mu_.
  bool stop_requested_ = false;             // Guarded by mu_.
  bool closed_ = false;                     // Guarded by mu_; nothing is queued once set.
  std::deque<std::unique_ptr<Op>> local_;   // Progress thread only.
};

}  // namespace tributary::dataplane
