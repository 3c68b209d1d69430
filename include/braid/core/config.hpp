// Every BRAID_* environment variable braid reads is declared in one table
// (src/core/config.cpp) with its default and a line of documentation, and is read
// through the accessors below. `braid-run --print-config` prints the table with the
// values in force. A malformed value is an Error(Errc::invalid_environment) naming the
// variable; it is never silently replaced by the default.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace braid::config {

struct Knob {
  std::string_view name;
  std::string_view default_value;  // empty: unset unless the user or a launcher sets it
  std::string_view doc;
};

// The table, in the order it is printed.
std::span<const Knob> knobs();

// Looks a knob up by name; throws InvariantError for a name missing from the table, so
// an undeclared knob is caught the first time its code runs.
const Knob& knob(std::string_view name);

// Reads the process environment. Tests pass their own lookup to the parsers instead.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;
EnvLookup process_env();

// The raw value: the environment's if set (even to ""), else nullopt.
std::optional<std::string> raw(std::string_view name, const EnvLookup& env = process_env());

// The value in force: the environment's if set and non-empty, else the default.
std::string string_value(std::string_view name, const EnvLookup& env = process_env());
std::int64_t int_value(std::string_view name, const EnvLookup& env = process_env());
// A finite decimal number ("0.3", "1e-2").
double number_value(std::string_view name, const EnvLookup& env = process_env());
bool bool_value(std::string_view name, const EnvLookup& env = process_env());
// A size given in KiB, in bytes; a value outside min_kib..max_kib is an
// Error(invalid_environment) naming the variable and the range.
std::size_t kib_value(std::string_view name, std::int64_t min_kib, std::int64_t max_kib,
                      const EnvLookup& env = process_env());
// Seconds, fractional allowed ("2.5").
std::chrono::nanoseconds seconds_value(std::string_view name, const EnvLookup& env = process_env());

// `text` without the blanks (spaces, tabs, newlines) around it: how every reader of the
// environment and of its files takes a value.
std::string_view trim(std::string_view text) noexcept;

// Strict parsers shared by every reader of the environment; `what` names the variable
// in the error message.
std::int64_t parse_int(std::string_view text, std::string_view what);
bool parse_bool(std::string_view text, std::string_view what);
std::chrono::nanoseconds parse_seconds(std::string_view text, std::string_view what);
// A CPU list as taskset and /sys write it: "3", "0-3", "0,2,4-7". Sorted, no repeats.
std::vector<int> parse_cpu_list(std::string_view text, std::string_view what);

// The table as printable text: name, value in force (or "(unset)"), default, doc.
std::string describe(const EnvLookup& env = process_env());

}  // namespace braid::config
