#include "common/trace.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/thread_name.h"
#include "nlohmann/json.hpp"

namespace tributary::common {
namespace {

using Json = nlohmann::json;

struct State {
  std::mutex mu;
  std::condition_variable cv;
  std::FILE* file = nullptr;                       // Guarded by mu.
  std::string buffer;                              // Guarded by mu: events not yet written.
  std::map<std::string, int, std::less<>> tracks;  // Guarded by mu.
  uint64_t max_events = 0;
  uint64_t events = 0;  // Guarded by mu.
  bool stopping = false;
  std::thread writer;
  int pid = 0;
};

std::atomic<bool> g_enabled{false};
std::atomic<uint64_t> g_dropped{0};
State& S() {
  static State* state = new State();
  return *state;
}

double Micros(Trace::TimePoint t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

Json ArgsJson(Trace::Args args) {
  Json a = Json::object();
  for (const auto& [k, v] : args) a[std::string(k)] = v;
  return a;
}

// Appends one event. mu held.
void AppendLocked(State& s, const Json& event) {
  s.buffer += event.dump();
  s.buffer += ",\n";
}

bool Admit(State& s) {
  if (s.file == nullptr) return false;
  if (s.events >= s.max_events) {
    g_dropped++;
    return false;
  }
  s.events++;
  return true;
}

int TrackLocked(State& s, std::string_view track) {
  auto it = s.tracks.find(track);
  if (it != s.tracks.end()) return it->second;
  const int tid = static_cast<int>(s.tracks.size()) + 1;
  s.tracks.emplace(std::string(track), tid);
  AppendLocked(s, Json{{"ph", "M"},
                       {"name", "thread_name"},
                       {"pid", s.pid},
                       {"tid", tid},
                       {"args", {{"name", std::string(track)}}}});
  AppendLocked(s, Json{{"ph", "M"},
                       {"name", "thread_sort_index"},
                       {"pid", s.pid},
                       {"tid", tid},
                       {"args", {{"sort_index", tid}}}});
  return tid;
}

void WriteLocked(State& s) {
  if (s.file == nullptr || s.buffer.empty()) return;
  std::fwrite(s.buffer.data(), 1, s.buffer.size(), s.file);
  std::fflush(s.file);
  s.buffer.clear();
}

void WriterLoop(State* s) {
  SetCurrentThreadName("trib-trace");
  std::unique_lock lock(s->mu);
  while (!s->stopping) {
    s->cv.wait_for(lock, std::chrono::milliseconds(250));
    WriteLocked(*s);
  }
}

}  // namespace

absl::Status Trace::Start(const std::string& path, std::string_view process_name,
                          uint64_t max_events) {
  State& s = S();
  std::lock_guard lock(s.mu);
  if (s.file != nullptr) return absl::FailedPreconditionError("a trace is already being recorded");
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create trace file '", path, "': ", std::strerror(errno)));
  }
  s.file = f;
  s.pid = static_cast<int>(::getpid());
  s.max_events = max_events;
  s.events = 0;
  s.tracks.clear();
  s.stopping = false;
  s.buffer = "[\n";
  AppendLocked(s, Json{{"ph", "M"},
                       {"name", "process_name"},
                       {"pid", s.pid},
                       {"tid", 0},
                       {"args", {{"name", std::string(process_name)}}}});
  s.writer = std::thread(WriterLoop, &s);
  g_enabled = true;
  return absl::OkStatus();
}

absl::Status Trace::Stop() {
  State& s = S();
  std::thread writer;
  {
    std::lock_guard lock(s.mu);
    if (s.file == nullptr) return absl::OkStatus();
    g_enabled = false;
    s.stopping = true;
    writer = std::move(s.writer);
  }
  s.cv.notify_all();
  if (writer.joinable()) writer.join();
  std::lock_guard lock(s.mu);
  AppendLocked(s, Json{{"ph", "M"},
                       {"name", "trace_stats"},
                       {"pid", s.pid},
                       {"tid", 0},
                       {"args", {{"events", s.events}, {"dropped", g_dropped.load()}}}});
  // The last element carries no comma: a strict JSON reader accepts the file too.
  if (s.buffer.size() >= 2) s.buffer.resize(s.buffer.size() - 2);
  s.buffer += "\n]\n";
  WriteLocked(s);
  const bool ok = std::ferror(s.file) == 0;
  std::fclose(s.file);
  s.file = nullptr;
  return ok ? absl::OkStatus() : absl::DataLossError("writing the trace file failed");
}

bool Trace::enabled() { return g_enabled.load(std::memory_order_relaxed); }
uint64_t Trace::dropped() { return g_dropped.load(); }

void Trace::Span(std::string_view track, std::string_view name, TimePoint start, TimePoint end,
                 Args args) {
  if (!enabled()) return;
  State& s = S();
  std::lock_guard lock(s.mu);
  if (!Admit(s)) return;
  const int tid = TrackLocked(s, track);
  Json e{{"ph", "X"},  {"name", std::string(name)}, {"pid", s.pid},
         {"tid", tid}, {"ts", Micros(start)},       {"dur", Micros(end) - Micros(start)}};
  if (args.size() > 0) e["args"] = ArgsJson(args);
  AppendLocked(s, e);
}

void Trace::Async(std::string_view name, uint64_t id, TimePoint start, TimePoint end, Args args) {
  if (!enabled()) return;
  State& s = S();
  std::lock_guard lock(s.mu);
  if (!Admit(s)) return;
  const std::string n(name);
  const std::string hex = absl::StrCat("0x", absl::Hex(id));
  Json b{{"ph", "b"},    {"cat", "op"}, {"name", n},          {"id", hex},
         {"pid", s.pid}, {"tid", 0},    {"ts", Micros(start)}};
  if (args.size() > 0) b["args"] = ArgsJson(args);
  AppendLocked(s, b);
  AppendLocked(s, Json{{"ph", "e"},
                       {"cat", "op"},
                       {"name", n},
                       {"id", hex},
                       {"pid", s.pid},
                       {"tid", 0},
                       {"ts", Micros(end)}});
}

void Trace::Counter(std::string_view name, TimePoint t, int64_t value) {
  if (!enabled()) return;
  State& s = S();
  std::lock_guard lock(s.mu);
  if (!Admit(s)) return;
  AppendLocked(s, Json{{"ph", "C"},
                       {"name", std::string(name)},
                       {"pid", s.pid},
                       {"ts", Micros(t)},
                       {"args", {{"value", value}}}});
}

}  // namespace tributary::common
