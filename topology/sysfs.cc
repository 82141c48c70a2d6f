#include "topology/sysfs.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace tributary::topology {

std::string ReadSysfsText(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(ss.str()));
}

std::optional<int64_t> ReadSysfsInt(const std::filesystem::path& path) {
  const std::string text = ReadSysfsText(path);
  absl::string_view s = text;
  int64_t v = 0;
  if (absl::ConsumePrefix(&s, "0x")) {
    uint64_t u = 0;
    if (!absl::SimpleHexAtoi(s, &u)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (!absl::SimpleAtoi(s, &v)) return std::nullopt;
  return v;
}

int64_t NicSpeedBitsPerSecond(const std::filesystem::path& sys_root, const std::string& name) {
  const std::optional<int64_t> mbps = ReadSysfsInt(sys_root / "class/net" / name / "speed");
  if (mbps && *mbps > 0) return *mbps * 1000000;
  const std::string rate = ReadSysfsText(sys_root / "class/infiniband" / name / "ports/1/rate");
  const std::vector<std::string> words = absl::StrSplit(rate, ' ');
  int64_t gbps = 0;
  if (!words.empty() && absl::SimpleAtoi(words[0], &gbps) && gbps > 0) return gbps * 1000000000;
  return 0;
}

}  // namespace tributary::topology
