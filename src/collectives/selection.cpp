#include <charconv>

#include <fmt/format.h>

#include <braid/collectives/selection.hpp>
#include <braid/core/config.hpp>
#include <braid/core/error.hpp>

namespace braid::collectives {
namespace {
using config::trim;

constexpr std::size_t kInfinity = std::numeric_limits<std::size_t>::max();
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

// The built-in table. Crossovers measured with `braid-bench collectives` on the 2-core
// development VM (2 and 4 ranks over UCX shared memory); see docs/algorithms.md.
std::vector<SelectionRule> built_in_rules() {
  using enum CollectiveKind;
  return {
      // Members on one node only: up to 16 KiB one wait through the inline slots, then
      // single copy or the segment (select() skips it otherwise).
      {.kind = all_reduce,
       .min_bytes = 0,
       .max_bytes = kInfinity,
       .algorithm = Algorithm::shared_memory},
      {.kind = all_reduce,
       .min_bytes = 0,
       .max_bytes = 16 * KiB,
       .algorithm = Algorithm::recursive_doubling},
      // Members on several nodes, some sharing one (select() skips it otherwise).
      {.kind = all_reduce,
       .min_bytes = 16 * KiB,
       .max_bytes = kInfinity,
       .algorithm = Algorithm::hierarchical},
      {.kind = all_reduce,
       .min_bytes = 16 * KiB,
       .max_bytes = 1 * MiB,
       .algorithm = Algorithm::halving_doubling},
      {.kind = all_reduce,
       .min_bytes = 1 * MiB,
       .max_bytes = kInfinity,
       .algorithm = Algorithm::ring},
      // Members on one node: the others read peers' buffers directly (single copy), where
      // the members agree they can; otherwise they fall back to the rules below. Up to
      // 64 KiB (reduce_scatter, all_to_all: of input; all_gather, gather: of output;
      // broadcast, scatter: of the root's data; all_reduce: 16 KiB) through the inline slots
      // instead, in one wait; the rooted ones wait only at the receiving end.
      {.kind = reduce_scatter, .algorithm = Algorithm::shared_memory},
      {.kind = all_gather, .algorithm = Algorithm::shared_memory},
      {.kind = broadcast, .algorithm = Algorithm::shared_memory},
      {.kind = reduce, .algorithm = Algorithm::shared_memory},
      {.kind = gather, .algorithm = Algorithm::shared_memory},
      {.kind = scatter, .algorithm = Algorithm::shared_memory},
      {.kind = all_to_all, .algorithm = Algorithm::shared_memory},
      // Members on several nodes, as many on each: rails across nodes, then within them.
      {.kind = reduce_scatter, .algorithm = Algorithm::hierarchical},
      {.kind = all_gather, .algorithm = Algorithm::hierarchical},
      {.kind = reduce_scatter, .algorithm = Algorithm::ring},
      {.kind = all_gather, .algorithm = Algorithm::ring},
      // Large vectors beyond one node: the chain sends every byte over every link once,
      // where the tree's root sends it log2(P) times.
      {.kind = broadcast, .min_bytes = 1 * MiB, .algorithm = Algorithm::ring},
      {.kind = broadcast, .algorithm = Algorithm::binomial_tree},
      {.kind = reduce, .algorithm = Algorithm::binomial_tree},
      {.kind = gather, .algorithm = Algorithm::linear},
      {.kind = scatter, .algorithm = Algorithm::linear},
      {.kind = all_to_all, .algorithm = Algorithm::pairwise},
      {.kind = barrier, .algorithm = Algorithm::shared_memory},  // one node only
      {.kind = barrier, .algorithm = Algorithm::dissemination},
  };
}

[[noreturn]] void malformed(std::string_view what, std::string_view text, std::string_view why) {
  throw Error(Errc::invalid_environment, fmt::format("{}='{}': {}", what, text, why),
              {.operation = "collectives.selection"});
}

std::size_t parse_size(std::string_view text, std::string_view what, std::string_view rule) {
  text = trim(text);
  if (text == "inf") return kInfinity;
  std::size_t multiplier = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'k':
      case 'K':
        multiplier = KiB;
        break;
      case 'm':
      case 'M':
        multiplier = MiB;
        break;
      case 'g':
      case 'G':
        multiplier = 1024 * MiB;
        break;
      default:
        break;
    }
    if (multiplier != 1) text.remove_suffix(1);
  }
  const std::string_view number = text;
  std::size_t value = 0;
  const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (number.empty() || error != std::errc{} || end != number.data() + number.size()) {
    malformed(what, rule, fmt::format("'{}' is not a size (bytes, with k/m/g, or inf)", number));
  }
  if (value > kInfinity / multiplier) {
    malformed(what, rule, fmt::format("'{}' times {} does not fit in 64 bits", number, multiplier));
  }
  return value * multiplier;
}

int parse_world(std::string_view text, std::string_view what, std::string_view rule) {
  text = trim(text);
  if (text == "inf") return std::numeric_limits<int>::max();
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size() || value < 1) {
    malformed(what, rule, fmt::format("'{}' is not a world size", text));
  }
  return value;
}

std::pair<std::string_view, std::string_view> split_once(std::string_view text, char separator) {
  const std::size_t at = text.find(separator);
  if (at == std::string_view::npos) return {text, {}};
  return {text.substr(0, at), text.substr(at + 1)};
}

std::string format_size(std::size_t bytes) {
  if (bytes == kInfinity) return "inf";
  if (bytes != 0 && bytes % MiB == 0) return fmt::format("{}m", bytes / MiB);
  if (bytes != 0 && bytes % KiB == 0) return fmt::format("{}k", bytes / KiB);
  return fmt::format("{}", bytes);
}

}  // namespace

std::vector<SelectionRule> parse_selection_rules(std::string_view text, std::string_view what) {
  std::vector<SelectionRule> rules;
  std::string_view rest = text;
  while (!trim(rest).empty()) {
    auto [group, after] = split_once(rest, ';');
    rest = after;
    group = trim(group);
    if (group.empty()) continue;
    auto [kind_name, ranges] = split_once(group, ':');
    const auto kind = parse_collective_kind(trim(kind_name));
    if (!kind) malformed(what, text, fmt::format("unknown collective '{}'", trim(kind_name)));
    if (trim(ranges).empty()) malformed(what, text, fmt::format("'{}' has no ranges", group));
    while (!trim(ranges).empty()) {
      auto [range_rule, more] = split_once(ranges, '#');
      ranges = more;
      auto [range, algorithm_and_world] = split_once(range_rule, ':');
      auto [algorithm_name, world] = split_once(algorithm_and_world, '@');
      auto [lo, hi] = split_once(range, '-');
      if (trim(hi).empty()) {
        malformed(what, text, fmt::format("'{}' is not a range lo-hi", trim(range)));
      }
      SelectionRule rule{.kind = *kind,
                         .min_bytes = parse_size(lo, what, text),
                         .max_bytes = parse_size(hi, what, text),
                         .algorithm = Algorithm::ring};
      if (rule.min_bytes >= rule.max_bytes) {
        malformed(what, text, fmt::format("the range '{}' is empty", trim(range)));
      }
      const auto algorithm = parse_algorithm(trim(algorithm_name));
      if (!algorithm) {
        malformed(what, text, fmt::format("unknown algorithm '{}'", trim(algorithm_name)));
      }
      if (!implements(*kind, *algorithm)) {
        malformed(what, text,
                  fmt::format("braid has no {} {}", to_string(*algorithm), to_string(*kind)));
      }
      rule.algorithm = *algorithm;
      if (!trim(world).empty()) {
        auto [world_lo, world_hi] = split_once(world, '-');
        rule.min_world = parse_world(world_lo, what, text);
        rule.max_world =
            trim(world_hi).empty() ? rule.min_world : parse_world(world_hi, what, text);
        if (rule.min_world > rule.max_world) {
          malformed(what, text, fmt::format("the world range '{}' is empty", trim(world)));
        }
      }
      rules.push_back(rule);
    }
  }
  return rules;
}

SelectionTable SelectionTable::built_in() {
  SelectionTable table;
  table.rules_ = built_in_rules();
  return table;
}

SelectionTable SelectionTable::with_overrides(std::string_view overrides) {
  SelectionTable table;
  table.rules_ = parse_selection_rules(overrides, "BRAID_ALGO");
  for (const SelectionRule& rule : built_in_rules()) table.rules_.push_back(rule);
  return table;
}

const SelectionTable& SelectionTable::from_environment() {
  static const SelectionTable table = with_overrides(config::string_value("BRAID_ALGO"));
  return table;
}

Algorithm SelectionTable::select(CollectiveKind kind, std::size_t bytes, int world_size,
                                 MemberPlacement placement) const {
  for (const SelectionRule& rule : rules_) {
    if (rule.algorithm == Algorithm::shared_memory && !placement.one_node) continue;
    if (rule.algorithm == Algorithm::hierarchical &&
        (!placement.grouped_nodes ||
         (rule.kind != CollectiveKind::all_reduce && !placement.even_nodes))) {
      continue;
    }
    if (rule.kind == kind && bytes >= rule.min_bytes && bytes < rule.max_bytes &&
        world_size >= rule.min_world && world_size <= rule.max_world) {
      return rule.algorithm;
    }
  }
  // The built-in rules cover every kind and size, so only a table built by hand gets here.
  throw Error(Errc::invalid_argument,
              fmt::format("no algorithm selected for {} of {} bytes on {} ranks", to_string(kind),
                          bytes, world_size),
              {.operation = "collectives.selection"});
}

std::string SelectionTable::describe() const {
  std::string text = fmt::format("{:<16} {:>8} {:>8} {:>8}  {}\n", "collective", "from", "to",
                                 "ranks", "algorithm");
  for (const SelectionRule& rule : rules_) {
    const std::string world =
        rule.min_world == 1 && rule.max_world == std::numeric_limits<int>::max()
            ? std::string("any")
            : fmt::format("{}-{}", rule.min_world,
                          rule.max_world == std::numeric_limits<int>::max()
                              ? std::string("inf")
                              : std::to_string(rule.max_world));
    text += fmt::format("{:<16} {:>8} {:>8} {:>8}  {}\n", to_string(rule.kind),
                        format_size(rule.min_bytes), format_size(rule.max_bytes), world,
                        to_string(rule.algorithm));
  }
  return text;
}

}  // namespace braid::collectives
