// whole_number: a count from the command line, checked whole: digits only, within
// [least, most], or std::invalid_argument naming the option, the limits and the start of
// what was given. The examples share it, so every count they take is bounded alike. Plain
// C++ (no braid headers): braid-bench's compute-tax programs without braid use it too.
#pragma once

#include <charconv>
#include <stdexcept>
#include <string>
#include <system_error>

namespace example_models {

inline constexpr int kMostCount = 1'000'000'000;

inline int whole_number(const std::string& option, const std::string& text, int least,
                        int most = kMostCount) {
  long long value = 0;
  const char* first = text.data();
  const char* last = first + text.size();
  const auto [end, error] = std::from_chars(first, last, value);
  if (text.empty() || error != std::errc() || end != last || value < least || value > most) {
    const std::string shown = text.size() > 48 ? text.substr(0, 48) + "..." : text;
    throw std::invalid_argument(option + " needs a whole number from " + std::to_string(least) +
                                " to " + std::to_string(most) + ", not '" + shown + "'");
  }
  return static_cast<int>(value);
}

}  // namespace example_models
