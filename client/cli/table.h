// Plain-text tables and number formatting for the CLI's human-readable output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tributary::client::cli {

// A table of text cells, rendered with columns padded to their widest cell and separated by two
// spaces, the header first, no trailing blanks. Not thread-safe.
class Table {
 public:
  enum class Align { kLeft, kRight };

  explicit Table(std::vector<std::string> header);

  // Alignment of `column` (default kLeft). Numbers read best right-aligned.
  void SetAlign(size_t column, Align align);
  // Adds a row; a short row is padded with empty cells, a long one widens the table.
  void AddRow(std::vector<std::string> cells);
  size_t num_rows() const { return rows_.size(); }

  // The whole table, one line per row, each ending in '\n'.
  std::string Render() const;

 private:
  std::vector<std::string> header_;
  std::vector<Align> align_;
  std::vector<std::vector<std::string>> rows_;
};

// `value` with `precision` digits after the point ("12.50").
std::string FormatFixed(double value, int precision);
// Bytes with a binary unit: "512 B", "4.0 KiB", "64.0 MiB", "1.5 GiB".
std::string FormatBytes(uint64_t bytes);
// Seconds with a readable unit: "850 us", "12.3 ms", "1.25 s"; "-" for a negative value.
std::string FormatSeconds(double seconds);
// Items joined by ','; "-" when there are none.
std::string JoinOrDash(const std::vector<std::string>& items);

}  // namespace tributary::client::cli
