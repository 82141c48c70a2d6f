#include "dataplane/transport/inprocess/inprocess_transport.h"

#include <future>

#include "absl/strings/str_cat.h"

namespace tributary::dataplane {

std::unique_ptr<InProcessTransport> InProcessNetwork::CreateEndpoint(const std::string& address) {
  std::unique_ptr<InProcessTransport> t(new InProcessTransport(this, address));
  std::lock_guard lock(mu_);
  endpoints_[address] = t.get();
  return t;
}

InProcessTransport* InProcessNetwork::Find(const std::string& address) {
  auto it = endpoints_.find(address);
  return it == endpoints_.end() ? nullptr : it->second;
}

void InProcessNetwork::Detach(const std::string& address) {
  std::lock_guard lock(mu_);
  endpoints_.erase(address);
}

void InProcessNetwork::Inject(const std::string& address, std::span<const std::byte> header,
                              std::span<const std::byte> payload) {
  std::lock_guard lock(mu_);
  if (InProcessTransport* t = Find(address)) {
    t->Deliver({header.begin(), header.end()}, {payload.begin(), payload.end()});
  }
}

void InProcessNetwork::SetFrozen(const std::string& address, bool frozen) {
  std::lock_guard lock(mu_);
  if (InProcessTransport* t = Find(address)) t->SetFrozen(frozen);
}

void InProcessNetwork::SetCut(const std::string& from, const std::string& to, bool cut) {
  std::lock_guard lock(mu_);
  if (cut) {
    cut_.emplace(from, to);
  } else {
    cut_.erase({from, to});
  }
}

InProcessTransport::InProcessTransport(InProcessNetwork* network, std::string address)
    : network_(network), address_(std::move(address)), thread_([this] { Run(); }) {}

InProcessTransport::~InProcessTransport() { Shutdown(); }

void InProcessTransport::SetReceiveHandler(ReceiveHandler handler) {
  std::lock_guard lock(mu_);
  handler_ = std::move(handler);
}

void InProcessTransport::Post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

bool InProcessTransport::Flush(std::chrono::milliseconds timeout) {
  auto reached = std::make_shared<std::promise<void>>();
  std::future<void> future = reached->get_future();
  // Tasks run in order, each destroyed before the next starts: this one runs after the rest.
  Post([reached] { reached->set_value(); });
  return future.wait_for(timeout) == std::future_status::ready;
}

void InProcessTransport::Deliver(std::vector<std::byte> header, std::vector<std::byte> payload) {
  auto task = [this, h = std::move(header), p = std::move(payload)] {
    ReceiveHandler handler;
    {
      std::lock_guard lock(mu_);
      handler = handler_;
    }
    if (handler) handler(h, p);
  };
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    (frozen_ ? held_ : tasks_).push_back(std::move(task));
  }
  cv_.notify_one();
}

void InProcessTransport::SetFrozen(bool frozen) {
  {
    std::lock_guard lock(mu_);
    frozen_ = frozen;
    if (!frozen) {
      for (auto& t : held_) tasks_.push_back(std::move(t));
      held_.clear();
    }
  }
  cv_.notify_one();
}

void InProcessTransport::Send(const std::string& peer_address, std::span<const std::byte> header,
                              std::span<const std::byte> payload, SendCallback done) {
  if (header.size() > kMaxHeaderBytes) {
    Post([done = std::move(done), n = header.size()] {
      done(absl::InvalidArgumentError(absl::StrCat("header of ", n, " bytes exceeds the limit")));
    });
    return;
  }
  bool delivered = false;
  {
    std::lock_guard lock(network_->mu_);
    if (InProcessTransport* peer = network_->Find(peer_address)) {
      if (!network_->cut_.contains({address_, peer_address})) {
        peer->Deliver({header.begin(), header.end()}, {payload.begin(), payload.end()});
      }
      delivered = true;
    }
  }
  absl::Status status = delivered
                            ? absl::OkStatus()
                            : absl::UnavailableError(absl::StrCat("no endpoint at ", peer_address));
  Post([done = std::move(done), status] { done(status); });
}

void InProcessTransport::Run() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    if (stopping_) break;
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

void InProcessTransport::Shutdown() {
  network_->Detach(address_);
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  // Pending tasks are completions and deliveries; dropping them is what a dead endpoint does.
  tasks_.clear();
  held_.clear();
}

}  // namespace tributary::dataplane
