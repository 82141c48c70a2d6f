#include "common/buffer_pool.h"

#include <algorithm>
#include <bit>
#include <list>
#include <map>
#include <mutex>
#include <vector>

namespace tributary::common {

struct BufferPool::State {
  struct Kept {
    uint64_t bytes;
    std::byte* p;
  };
  std::mutex mu;
  uint64_t keep_bytes;
  std::list<Kept> kept;                                                 // oldest return first
  std::map<uint64_t, std::vector<std::list<Kept>::iterator>> by_class;  // latest at back
  Stats stats;

  explicit State(uint64_t keep) : keep_bytes(keep) {}
  ~State() {
    for (Kept& k : kept) delete[] k.p;
  }

  // Frees the oldest kept buffers until `room` more bytes fit. mu held; the pointers to free
  // are added to `drop`.
  void MakeRoomLocked(uint64_t room, std::vector<std::byte*>& drop) {
    while (!kept.empty() && stats.kept_bytes + room > keep_bytes) {
      const Kept oldest = kept.front();
      std::vector<std::list<Kept>::iterator>& same = by_class[oldest.bytes];
      same.erase(same.begin());  // the oldest of its class is the oldest in its list
      if (same.empty()) by_class.erase(oldest.bytes);
      kept.pop_front();
      stats.kept_bytes -= oldest.bytes;
      stats.kept_buffers--;
      stats.freed++;
      drop.push_back(oldest.p);
    }
  }

  void Return(std::byte* p, uint64_t bytes) {
    std::vector<std::byte*> drop;
    {
      std::lock_guard lock(mu);
      if (bytes > keep_bytes) {
        stats.freed++;
        drop.push_back(p);
      } else {
        MakeRoomLocked(bytes, drop);
        by_class[bytes].push_back(kept.insert(kept.end(), Kept{bytes, p}));
        stats.kept_bytes += bytes;
        stats.kept_buffers++;
      }
    }
    for (std::byte* q : drop) delete[] q;
  }
};

BufferPool::BufferPool(uint64_t keep_bytes) : state_(std::make_shared<State>(keep_bytes)) {}

BufferPool& BufferPool::Process() {
  static BufferPool* const pool = new BufferPool();  // never destroyed: buffers may be out at exit
  return *pool;
}

uint64_t BufferPool::ClassBytes(uint64_t bytes) {
  if (bytes < kMinPooledBytes) return bytes;
  const uint64_t step = std::bit_floor(bytes) / 4;
  return (bytes + step - 1) / step * step;
}

std::shared_ptr<std::byte[]> BufferPool::Get(uint64_t bytes) {
  const uint64_t size = ClassBytes(bytes);
  if (size < kMinPooledBytes) {
    return std::shared_ptr<std::byte[]>(new std::byte[std::max<uint64_t>(size, 1)]);
  }
  std::byte* p = nullptr;
  {
    std::lock_guard lock(state_->mu);
    auto it = state_->by_class.find(size);
    if (it != state_->by_class.end()) {
      p = it->second.back()->p;
      state_->kept.erase(it->second.back());
      it->second.pop_back();
      if (it->second.empty()) state_->by_class.erase(it);
      state_->stats.kept_bytes -= size;
      state_->stats.kept_buffers--;
      state_->stats.reused++;
    } else {
      state_->stats.allocated++;
    }
  }
  if (p == nullptr) p = new std::byte[size];
  return std::shared_ptr<std::byte[]>(p, [state = state_, size](std::byte* q) mutable {
    state->Return(q, size);
    state.reset();
  });
}

void BufferPool::SetKeepBytes(uint64_t keep_bytes) {
  std::vector<std::byte*> drop;
  {
    std::lock_guard lock(state_->mu);
    state_->keep_bytes = keep_bytes;
    state_->MakeRoomLocked(0, drop);
  }
  for (std::byte* p : drop) delete[] p;
}

BufferPool::Stats BufferPool::stats() const {
  std::lock_guard lock(state_->mu);
  return state_->stats;
}

}  // namespace tributary::common
