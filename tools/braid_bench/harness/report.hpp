// What braid-bench writes: the one-line JSON objects its workers print and its modes print
// with --json (JsonLine, header-only so that the workers need no library), and the modes'
// tables for people (Report), so that every mode lays out its heading and its rows the same
// way and says only what its columns hold.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

namespace braid::bench {

// One JSON object on one line, its keys in the order added: {"runner":"DDP","step_ms":12.500}.
class JsonLine {
 public:
  // Text quoted; anything else (a number) as `format` writes it.
  template <class T>
  JsonLine& add(std::string_view key, const T& value, std::string_view format = "{}") {
    if constexpr (std::is_convertible_v<const T&, std::string_view>) {
      return raw(key, fmt::format("\"{}\"", std::string_view(value)));
    } else {
      return raw(key, fmt::format(fmt::runtime(format), value));
    }
  }
  // Each of `keys` that `figures` holds, as `format` writes it, named `prefix` + its key.
  JsonLine& add_each(const std::map<std::string, double>& figures,
                     const std::vector<std::string>& keys, std::string_view format,
                     std::string_view prefix = "") {
    for (const std::string& key : keys) {
      if (const auto at = figures.find(key); at != figures.end())
        add(std::string(prefix) + key, at->second, format);
    }
    return *this;
  }
  // A value already written as JSON: null, an object, an array.
  JsonLine& raw(std::string_view key, std::string_view json) {
    text_ += fmt::format("{}\"{}\":{}", text_.size() > 1 ? "," : "", key, json);
    return *this;
  }
  std::string str() const { return text_ + "}"; }

 private:
  std::string text_ = "{";
};

// `value` with `decimals` decimals, then `suffix`; "-" where there is none.
std::string fixed(const std::optional<double>& value, int decimals, std::string_view suffix = "");

// A mode's output: with --json one JSON line a row, else a table for people, between the
// mode's words before it and after it. Its columns: each one's heading (lines split at '\n', the
// top line the first) and width, padded on the left (right-aligned) or, where the width is
// negative, on the right.
class Report {
 public:
  Report(bool json, std::vector<std::string> headings, std::vector<int> widths)
      : json_(json), headings_(std::move(headings)), widths_(std::move(widths)) {}
  // Words for people, printed as they are (not with --json).
  void say(std::string_view text) const;
  // The columns' headings.
  void heading() const;
  // One row: the JSON line `json` with --json, else `cells` in the first cells.size() columns.
  void row(const std::string& json, const std::vector<std::string>& cells) const;
  // The cells laid out in the columns, as row() prints them.
  std::string line(const std::vector<std::string>& cells) const;

 private:
  bool json_;
  std::vector<std::string> headings_;
  std::vector<int> widths_;
};

}  // namespace braid::bench
