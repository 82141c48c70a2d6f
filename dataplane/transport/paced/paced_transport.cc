#include "dataplane/transport/paced/paced_transport.h"

namespace tributary::dataplane {

PacedTransport::PacedTransport(std::unique_ptr<Transport> inner, double bytes_per_s)
    : inner_(std::move(inner)), bytes_per_s_(bytes_per_s), thread_([this] { Run(); }) {}

PacedTransport::~PacedTransport() { Shutdown(); }

void PacedTransport::Send(const std::string& peer_address, std::span<const std::byte> header,
                          std::span<const std::byte> payload, SendCallback done) {
  const auto now = std::chrono::steady_clock::now();
  const auto wire = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>((header.size() + payload.size()) / bytes_per_s_));
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      link_free_ = std::max(link_free_, now) + wire;
      held_.push(Held{link_free_,
                      seq_++,
                      peer_address,
                      {header.begin(), header.end()},
                      payload,
                      std::move(done)});
      cv_.notify_one();
      return;
    }
  }
  done(absl::CancelledError("transport is shut down"));
}

void PacedTransport::Run() {
  std::unique_lock lock(mu_);
  while (true) {
    if (stopping_) break;
    if (held_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const auto departure = held_.top().departure;
    if (std::chrono::steady_clock::now() < departure) {
      cv_.wait_until(lock, departure);
      continue;
    }
    Held h = std::move(const_cast<Held&>(held_.top()));
    held_.pop();
    lock.unlock();
    inner_->Send(h.peer, h.header, h.payload, std::move(h.done));
    lock.lock();
  }
}

void PacedTransport::Shutdown() {
  std::vector<Held> dropped;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    while (!held_.empty()) {
      dropped.push_back(std::move(const_cast<Held&>(held_.top())));
      held_.pop();
    }
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (Held& h : dropped) h.done(absl::CancelledError("transport is shut down"));
  inner_->Shutdown();
}

}  // namespace tributary::dataplane
