#include "results.hpp"

#include <iostream>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "subprocess.hpp"

namespace braid::bench {

std::optional<double> json_number(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\":");
  if (at == std::string::npos) return std::nullopt;
  try {
    return std::stod(line.substr(at + key.size() + 3));
  } catch (const std::exception&) {
    throw std::runtime_error("\"" + key + "\" is not followed by a number in " + line);
  }
}

std::string json_text(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\":\"");
  if (at == std::string::npos) return "";
  const auto from = at + key.size() + 4;
  return line.substr(from, line.find('"', from) - from);
}

namespace {

// Each of `keys` the lines hold, `of` the values of the lines that hold it.
template <class Of>
std::map<std::string, double> figures_of(const std::vector<std::string>& lines,
                                         const std::vector<std::string>& keys, Of&& of) {
  std::map<std::string, double> figures;
  for (const std::string& key : keys) {
    std::vector<double> values;
    for (const std::string& line : lines) {
      if (const auto value = json_number(line, key)) values.push_back(*value);
    }
    if (!values.empty()) figures[key] = of(values);
  }
  return figures;
}

}  // namespace

std::map<std::string, double> medians(const std::vector<std::string>& lines,
                                      const std::vector<std::string>& keys) {
  return figures_of(lines, keys, [](const std::vector<double>& values) { return median(values); });
}

std::map<std::string, double> means(const std::vector<std::string>& lines,
                                    const std::vector<std::string>& keys) {
  return figures_of(lines, keys, [&](const std::vector<double>& values) {
    return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(lines.size());
  });
}

std::optional<std::string> result_line(const CommandResult& result, std::string_view marker,
                                       std::string_view mode, std::string_view who, bool any_exit) {
  std::stringstream lines(result.output);
  const std::string start = fmt::format("{{\"{}\"", marker);
  for (std::string line; std::getline(lines, line);) {
    const auto brace = line.find(start);
    if (brace != std::string::npos && (any_exit || result.exit_code == 0)) {
      return line.substr(brace);
    }
  }
  std::cerr << fmt::format("braid-bench {}: {} printed no result (exit {}):\n{}\n", mode, who,
                           result.exit_code, result.output);
  return std::nullopt;
}

}  // namespace braid::bench
