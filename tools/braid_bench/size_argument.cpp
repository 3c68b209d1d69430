#include "size_argument.hpp"

#include <stdexcept>

namespace braid::bench {

std::size_t parse_bytes(const std::string& text) {
  std::size_t end = 0;
  const unsigned long long value = std::stoull(text, &end);
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
    throw std::invalid_argument("'" + text + "' is not a size");
  }
  return static_cast<std::size_t>(value) * multiplier;
}

}  // namespace braid::bench
