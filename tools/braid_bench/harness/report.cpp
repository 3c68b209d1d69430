#include "report.hpp"

#include <iostream>
#include <sstream>

namespace braid::bench {

std::string fixed(const std::optional<double>& value, int decimals, std::string_view suffix) {
  if (!value) return "-";
  return fmt::format("{:.{}f}{}", *value, decimals, suffix);
}

void Report::say(std::string_view text) const {
  if (!json_) std::cout << text << std::flush;
}

std::string Report::line(const std::vector<std::string>& cells) const {
  std::string text;
  for (std::size_t c = 0; c < cells.size() && c < widths_.size(); ++c) {
    const int width = widths_[c];
    text += c == 0 ? "" : " ";
    text += width < 0 ? fmt::format("{:<{}}", cells[c], -width)
                      : fmt::format("{:>{}}", cells[c], width);
  }
  return text + "\n";
}

void Report::heading() const {
  std::vector<std::vector<std::string>> lines;
  for (std::size_t c = 0; c < headings_.size(); ++c) {
    std::istringstream heading(headings_[c]);
    std::size_t at = 0;
    for (std::string part; std::getline(heading, part); ++at) {
      if (lines.size() <= at) lines.emplace_back(headings_.size());
      lines[at][c] = part;
    }
  }
  for (const auto& cells : lines) say(line(cells));
}

void Report::row(const std::string& json, const std::vector<std::string>& cells) const {
  if (json_) {
    std::cout << json << std::endl;
  } else {
    say(line(cells));
  }
}

}  // namespace braid::bench
