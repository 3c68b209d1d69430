// Lists and counts on braid-bench's command line: "--ranks 2,4", "--models mlp,transformer",
// "--rounds 3".
#pragma once

#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace braid::bench {

// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

// A whole number from `least` to `most`; anything else (a sign, a suffix, an overflow) is a
// std::invalid_argument naming the option.
inline int count_argument(const std::string& option, const std::string& text, int least, int most) {
  long long value = 0;
  std::size_t used = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < least || value > most) {
    throw std::invalid_argument(option + " needs a whole number from " + std::to_string(least) +
                                " to " + std::to_string(most) + ", not '" + text + "'");
  }
  return static_cast<int>(value);
}

// Options that take a whole number: each option's variable and least value.
using CountOptions = std::map<std::string, std::pair<int*, int>>;

// Sets `option`'s variable from `value` if it is one of `counts` (up to 100000); false if not.
inline bool take_count(const CountOptions& counts, const std::string& option,
                       const std::string& value) {
  const auto count = counts.find(option);
  if (count == counts.end()) return false;
  *count->second.first = count_argument(option, value, count->second.second, 100000);
  return true;
}

// A number from `least` to `most` ("2.5"); anything else is a std::invalid_argument naming
// the option.
inline double decimal_argument(const std::string& option, const std::string& text, double least,
                               double most) {
  double value = 0;
  std::size_t used = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(value >= least && value <= most)) {
    throw std::invalid_argument(
        fmt::format("{} needs a number from {:g} to {:g}, not '{}'", option, least, most, text));
  }
  return value;
}

}  // namespace braid::bench
