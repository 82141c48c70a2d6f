#include "topology/topology_util.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace tributary::topology {
namespace {

bool Hex(absl::string_view s, size_t max_digits, unsigned* out) {
  if (s.empty() || s.size() > max_digits) return false;
  uint32_t v = 0;
  if (!absl::SimpleHexAtoi(s, &v)) return false;
  *out = v;
  return true;
}

template <typename T, typename Less>
void SortRepeated(google::protobuf::RepeatedPtrField<T>* field, Less less) {
  std::vector<T> items(field->begin(), field->end());
  std::stable_sort(items.begin(), items.end(), less);
  field->Clear();
  for (T& item : items) *field->Add() = std::move(item);
}

}  // namespace

std::string NormalizeBusId(std::string_view bus_id_std) {
  absl::string_view bus_id(bus_id_std.data(), bus_id_std.size());
  std::vector<absl::string_view> parts = absl::StrSplit(bus_id, ':');
  if (parts.size() == 2) parts.insert(parts.begin(), "0");
  if (parts.size() != 3) return "";
  std::vector<absl::string_view> dev_fn = absl::StrSplit(parts[2], '.');
  if (dev_fn.size() != 2) return "";
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  if (!Hex(parts[0], 8, &domain) || !Hex(parts[1], 2, &bus) || !Hex(dev_fn[0], 2, &dev) ||
      !Hex(dev_fn[1], 1, &fn) || domain > 0xffff || dev > 0x1f || fn > 7) {
    return "";
  }
  return absl::StrFormat("%04x:%02x:%02x.%x", domain, bus, dev, fn);
}

void SortTopology(tributary::v1::Topology& t) {
  using namespace tributary::v1;  // NOLINT: message names only
  SortRepeated(t.mutable_sockets(),
               [](const Socket& a, const Socket& b) { return a.id() < b.id(); });
  SortRepeated(t.mutable_pcie_switches(),
               [](const PcieSwitch& a, const PcieSwitch& b) { return a.id() < b.id(); });
  SortRepeated(t.mutable_gpus(), [](const Gpu& a, const Gpu& b) { return a.index() < b.index(); });
  SortRepeated(t.mutable_nics(), [](const Nic& a, const Nic& b) { return a.name() < b.name(); });
  for (auto& l : *t.mutable_nvlinks()) {
    if (l.gpu_a() > l.gpu_b()) {
      int a = l.gpu_a();
      l.set_gpu_a(l.gpu_b());
      l.set_gpu_b(a);
    }
  }
  SortRepeated(t.mutable_nvlinks(), [](const NvLinkConnection& a, const NvLinkConnection& b) {
    return std::make_pair(a.gpu_a(), a.gpu_b()) < std::make_pair(b.gpu_a(), b.gpu_b());
  });
  if (t.has_nvswitch()) {
    auto* g = t.mutable_nvswitch()->mutable_gpus();
    std::sort(g->begin(), g->end());
  }
}

}  // namespace tributary::topology
