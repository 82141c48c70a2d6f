#include "client/cli/table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

namespace tributary::client::cli {

Table::Table(std::vector<std::string> header)
    : header_(std::move(header)), align_(header_.size(), Align::kLeft) {}

void Table::SetAlign(size_t column, Align align) {
  if (column >= align_.size()) align_.resize(column + 1, Align::kLeft);
  align_[column] = align;
}

void Table::AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }

std::string Table::Render() const {
  size_t columns = header_.size();
  for (const auto& row : rows_) columns = std::max(columns, row.size());
  std::vector<size_t> width(columns, 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  };
  measure(header_);
  for (const auto& row : rows_) measure(row);

  std::string out;
  auto render_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < columns; ++c) {
      const std::string& cell = c < row.size() ? row[c] : std::string();
      const size_t pad = width[c] - cell.size();
      const bool right = c < align_.size() && align_[c] == Align::kRight;
      if (c > 0) line += "  ";
      if (right) line.append(pad, ' ');
      line += cell;
      if (!right) line.append(pad, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line;
    out += '\n';
  };
  render_row(header_);
  for (const auto& row : rows_) render_row(row);
  return out;
}

std::string FormatFixed(double value, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, value);
  return buf;
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  return FormatFixed(value, 1) + " " + kUnits[unit];
}

std::string FormatSeconds(double seconds) {
  if (seconds < 0 || std::isnan(seconds)) return "-";
  if (seconds < 1e-3) return FormatFixed(seconds * 1e6, 0) + " us";
  if (seconds < 1.0) return FormatFixed(seconds * 1e3, seconds < 0.1 ? 2 : 1) + " ms";
  return FormatFixed(seconds, 2) + " s";
}

std::string JoinOrDash(const std::vector<std::string>& items) {
  if (items.empty()) return "-";
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += ',';
    out += item;
  }
  return out;
}

}  // namespace tributary::client::cli
