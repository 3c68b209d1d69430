// What braid-bench's workers and peers print, read back: the one-line JSON objects
// ({"step_ms":12.5,...}) read by key rather than parsed as whole documents, and the medians
// the modes report, so that one slow round (another process taking the core) does not move
// a figure.
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace braid::bench {

struct CommandResult;

// The upper median for an even count. `values` must not be empty.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The number after "key": in `line`; nullopt when the key is absent. A key followed by
// something that is not a number is a std::runtime_error naming both.
std::optional<double> json_number(const std::string& line, const std::string& key);
// A string field's value ("counts":"179 77"), empty when absent.
std::string json_text(const std::string& line, const std::string& key);

// Each of `keys` the lines hold, the median over the lines that hold it.
std::map<std::string, double> medians(const std::vector<std::string>& lines,
                                      const std::vector<std::string>& keys);
// Each of `keys` the lines hold, its sum over the lines that hold it over all the lines.
std::map<std::string, double> means(const std::vector<std::string>& lines,
                                    const std::vector<std::string>& keys);
// The figure `key` of `figures`, nullopt where absent.
inline std::optional<double> figure(const std::map<std::string, double>& figures,
                                    const std::string& key) {
  const auto at = figures.find(key);
  return at == figures.end() ? std::nullopt : std::optional(at->second);
}

// The JSON line that starts with `{"<marker>"` in a worker's output (braid-run prefixes it with
// "[0] "); nullopt, with the output on stderr naming `mode` and `who`, where it printed none
// or (unless `any_exit`) exited with an error.
std::optional<std::string> result_line(const CommandResult& result, std::string_view marker,
                                       std::string_view mode, std::string_view who,
                                       bool any_exit = false);

}  // namespace braid::bench
