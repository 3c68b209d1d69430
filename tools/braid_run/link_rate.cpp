#include "link_rate.hpp"

#include <regex>
#include <stdexcept>

#include <fmt/format.h>

namespace braid::launcher {

LinkRate LinkRate::parse(const std::string& text) {
  static const std::regex pattern(R"(([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit))");
  std::smatch match;
  if (!std::regex_match(text, match, pattern)) {
    throw std::invalid_argument(fmt::format(
        "link rate '{}' is not a number and a unit (bit, kbit, mbit, gbit, tbit: 10gbit)", text));
  }
  const std::string unit = match[3];
  const double scale = unit == "bit"    ? 1
                       : unit == "kbit" ? 1e3
                       : unit == "mbit" ? 1e6
                       : unit == "gbit" ? 1e9
                                        : 1e12;
  const double bits = std::stod(match[1]) * scale;
  if (bits < 1e5) {
    throw std::invalid_argument(
        fmt::format("link rate '{}' is below 100kbit, too slow to start a job over", text));
  }
  return LinkRate{.text = text, .bytes_per_second = bits / 8};
}

}  // namespace braid::launcher
