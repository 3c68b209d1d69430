// Numbers from the one-line JSON objects braid-bench's workers and peers print
// ({"step_ms":12.5,...}): the driver reads them by key rather than parsing whole documents.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

namespace braid::bench {

// The number after "key": in `line`; nullopt when the key is absent. A key followed by
// something that is not a number is a std::runtime_error naming both.
inline std::optional<double> json_number(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\":");
  if (at == std::string::npos) return std::nullopt;
  try {
    return std::stod(line.substr(at + key.size() + 3));
  } catch (const std::exception&) {
    throw std::runtime_error("\"" + key + "\" is not followed by a number in " + line);
  }
}

}  // namespace braid::bench
