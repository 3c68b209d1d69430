#include <charconv>
#include <iterator>
#include <utility>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/hostlist.hpp>

namespace braid::transport {
namespace {

// lo-hi inclusive, each number written with at least `width` digits.
struct Range {
  std::int64_t low = 0;
  std::int64_t high = 0;
  int width = 0;
};

// Literal text, then the bracket group that follows it (none for a plain name).
struct Piece {
  std::string_view text;
  std::vector<Range> group;
};

// One comma-separated name: its pieces and how many hosts their product holds.
struct Name {
  std::vector<Piece> pieces;
  std::int64_t hosts = 1;
};

class Parser {
 public:
  Parser(std::string_view list, std::string_view what) : list_(list), what_(what) {}

  // The names, each counted; throws for malformed text and past kMostRanks hosts.
  std::vector<Name> names() {
    std::vector<Name> names;
    std::int64_t total = 0;
    while (true) {
      names.push_back(name());
      total += names.back().hosts;
      check_count(total);
      if (at_ == list_.size()) return names;
      ++at_;  // the comma name() stopped at
    }
  }

 private:
  template <typename... Args>
  [[noreturn]] void malformed(fmt::format_string<Args...> format, Args&&... args) const {
    throw Error(Errc::invalid_environment,
                fmt::format("{}='{}' is not a Slurm host list such as node[01-04,07]: {}", what_,
                            list_, fmt::format(format, std::forward<Args>(args)...)));
  }

  // Every count is checked as soon as it grows, so none overflows: a range holds fewer
  // than 10^18 numbers, and is added to or multiplied by counts of at most kMostRanks.
  void check_count(std::int64_t hosts) const {
    if (hosts > kMostRanks) {
      throw Error(Errc::invalid_environment,
                  fmt::format("{}='{}' names more than {} hosts, more than a braid job may have "
                              "ranks",
                              what_, list_, kMostRanks));
    }
  }

  // Up to the next comma outside brackets, or the end.
  Name name() {
    const std::size_t start = at_;
    Name name;
    while (true) {
      const std::size_t text_start = at_;
      while (at_ < list_.size() && list_[at_] != ',' && list_[at_] != '[') {
        if (list_[at_] == ']') malformed("']' at offset {} closes no '['", at_);
        if (list_[at_] == ' ' || list_[at_] == '\t' || list_[at_] == '\n') {
          malformed("a blank at offset {}", at_);
        }
        ++at_;
      }
      Piece piece{list_.substr(text_start, at_ - text_start), {}};
      const bool bracket = at_ < list_.size() && list_[at_] == '[';
      if (!bracket) {
        if (at_ == start) malformed("an empty name at offset {}", start);
        if (!name.pieces.empty() && !piece.text.empty()) {
          malformed("'{}' follows the last bracket group of a name", piece.text);
        }
        if (name.pieces.empty()) name.pieces.push_back(piece);
        return name;
      }
      piece.group = group();
      std::int64_t size = 0;
      for (const Range& range : piece.group) {
        size += range.high - range.low + 1;
        check_count(size);
      }
      name.hosts *= size;
      check_count(name.hosts);
      name.pieces.push_back(std::move(piece));
    }
  }

  // "[1-3,07]", at_ on its '['.
  std::vector<Range> group() {
    const std::size_t open = at_++;
    const std::size_t close = list_.find(']', at_);
    if (close == std::string_view::npos) malformed("the '[' at offset {} is never closed", open);
    std::string_view inside = list_.substr(at_, close - at_);
    if (inside.find('[') != std::string_view::npos) {
      malformed("a '[' inside the bracket group at offset {}", open);
    }
    at_ = close + 1;
    std::vector<Range> ranges;
    while (true) {
      const std::size_t comma = inside.find(',');
      ranges.push_back(range(inside.substr(0, comma)));
      if (comma == std::string_view::npos) return ranges;
      inside.remove_prefix(comma + 1);
    }
  }

  // "7" or "01-04".
  Range range(std::string_view text) const {
    const std::size_t dash = text.find('-');
    std::string_view low = text.substr(0, dash);
    std::string_view high = dash == std::string_view::npos ? low : text.substr(dash + 1);
    const Range bounds{number(low, text), number(high, text), static_cast<int>(low.size())};
    if (bounds.low > bounds.high) malformed("the range '{}' runs backwards", text);
    return bounds;
  }

  // One bound of `range_text`: the 04 of 01-04.
  std::int64_t number(std::string_view digits, std::string_view range_text) const {
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos) {
      malformed("'{}' is not a number or a range of numbers such as 01-04", range_text);
    }
    // 18 digits always fit an int64_t; no host name needs more.
    if (digits.size() > 18) malformed("'{}' has more than 18 digits", digits);
    std::int64_t value = 0;
    std::from_chars(digits.data(), digits.data() + digits.size(), value);
    return value;
  }

  std::string_view list_;
  std::string_view what_;
  std::size_t at_ = 0;
};

// Appends every host of `name` from its piece `piece` on, each after `host`, in Slurm's
// order: the last bracket group varies fastest.
void expand(const Name& name, std::size_t piece, std::string& host,
            std::vector<std::string>& hosts) {
  if (piece == name.pieces.size()) {
    hosts.push_back(host);
    return;
  }
  const std::size_t before = host.size();
  host += name.pieces[piece].text;
  if (name.pieces[piece].group.empty()) expand(name, piece + 1, host, hosts);
  const std::size_t after_text = host.size();
  for (const Range& range : name.pieces[piece].group) {
    for (std::int64_t n = range.low; n <= range.high; ++n) {
      fmt::format_to(std::back_inserter(host), "{:0{}}", n, range.width);
      expand(name, piece + 1, host, hosts);
      host.resize(after_text);
    }
  }
  host.resize(before);
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list, std::string_view what) {
  const std::vector<Name> names = Parser(list, what).names();
  std::int64_t total = 0;
  for (const Name& name : names) total += name.hosts;
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<std::size_t>(total));
  std::string host;
  for (const Name& name : names) expand(name, 0, host, hosts);
  return hosts;
}

std::string first_host(std::string_view list, std::string_view what) {
  const std::vector<Name> names = Parser(list, what).names();
  std::string host;
  for (const Piece& piece : names.front().pieces) {
    host += piece.text;
    if (!piece.group.empty()) {
      host += fmt::format("{:0{}}", piece.group.front().low, piece.group.front().width);
    }
  }
  return host;
}

std::int64_t count_hosts(std::string_view list, std::string_view what) {
  std::int64_t hosts = 0;
  for (const Name& name : Parser(list, what).names()) hosts += name.hosts;
  return hosts;
}

}  // namespace braid::transport
