// anon_huge_kib_at: how much of the mapping that holds an address lies on transparent huge
// pages (AnonHugePages in /proc/self/smaps, in KiB; -1 where no mapping holds it), for
// tests of what braid moves onto huge pages (huge_page_advice.hpp).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace braid::testing {

inline long anon_huge_kib_at(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    // A mapping's header line starts "from-to perms ...", in lowercase hex.
    const std::size_t dash = line.find('-');
    if (dash != std::string::npos && dash > 0 && line.find(' ') > dash &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      const std::uintptr_t from = std::stoull(line.substr(0, dash), nullptr, 16);
      const std::uintptr_t to = std::stoull(line.substr(dash + 1), nullptr, 16);
      inside = from <= at && at < to;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      return std::stol(line.substr(14));
    }
  }
  return -1;
}

}  // namespace braid::testing
