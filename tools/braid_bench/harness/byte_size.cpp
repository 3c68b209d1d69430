#include "byte_size.hpp"

#include <stdexcept>

#include <braid/core/excerpt.hpp>

namespace braid::bench {

std::size_t parse_bytes(const std::string& text) {
  // stoull reads "-1" as 2^64 - 1: only digits may start a size.
  if (text.empty() || text[0] < '0' || text[0] > '9') {
    throw std::invalid_argument("'" + braid::excerpt(text) +
                                "' is not a size (digits, then K, M or G)");
  }
  std::size_t end = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &end);
  } catch (const std::out_of_range&) {
    throw std::invalid_argument("'" + braid::excerpt(text) + "' is larger than " +
                                std::to_string(kMostBytes >> 30) + "G");
  }
  std::string suffix = text.substr(end);
  for (const char* unit : {"iB", "B"}) {
    if (suffix.size() > 1 && suffix.ends_with(unit)) {
      suffix.resize(suffix.size() - std::string(unit).size());
    }
  }
  std::size_t multiplier = 1;
  if (suffix == "K" || suffix == "k") {
    multiplier = 1 << 10;
  } else if (suffix == "M" || suffix == "m") {
    multiplier = 1 << 20;
  } else if (suffix == "G" || suffix == "g") {
    multiplier = 1 << 30;
  } else if (!suffix.empty()) {
    throw std::invalid_argument("'" + braid::excerpt(text) + "' is not a size");
  }
  if (value > kMostBytes / multiplier) {
    throw std::invalid_argument("'" + braid::excerpt(text) + "' is larger than " +
                                std::to_string(kMostBytes >> 30) + "G");
  }
  return static_cast<std::size_t>(value) * multiplier;
}

}  // namespace braid::bench
