// GridSpec (grid_spec.hpp): axis names, order strings, and degrees from options or the
// environment.
#include <algorithm>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include <braid/parallel/grid_spec.hpp>

namespace braid::parallel {
namespace {

constexpr std::string_view kAxisNames = "tp, cp, dp, pp";

std::optional<Axis> axis_named(std::string_view name) noexcept {
  for (Axis axis : all_axes) {
    if (axis_name(axis) == name) return axis;
  }
  return std::nullopt;
}

// The names of `text` between the '-'s; each must be an axis, named once.
std::vector<Axis> parse_axis_list(std::string_view text, Errc code, std::string_view what,
                                  std::string_view list_kind) {
  const std::string_view trimmed = config::trim(text);
  if (trimmed.empty()) {
    throw Error(code, fmt::format("{}='{}' names no axis: {} is axis names joined by '-' from {}",
                                  what, text, list_kind, kAxisNames));
  }
  std::vector<Axis> axes;
  std::string_view rest = trimmed;
  while (true) {
    const std::size_t dash = rest.find('-');
    const std::string_view name = rest.substr(0, dash);
    const auto axis = axis_named(name);
    if (!axis) {
      throw Error(code, fmt::format("{}='{}': '{}' is not an axis (the axes are {})", what, text,
                                    name, kAxisNames));
    }
    if (std::find(axes.begin(), axes.end(), *axis) != axes.end()) {
      throw Error(code, fmt::format("{}='{}' names {} twice", what, text, name));
    }
    axes.push_back(*axis);
    if (dash == std::string_view::npos) break;
    rest = rest.substr(dash + 1);
  }
  return axes;
}

// A degree from an option or, where it is unset, from the knob. dp alone may be 0.
int degree_of(Axis axis, const std::optional<int>& option, const config::EnvLookup& env) {
  const std::int64_t least = axis == Axis::dp ? 0 : 1;
  const std::string_view meaning =
      axis == Axis::dp ? "a degree (at least 1, or 0 to infer it)" : "a degree (at least 1)";
  if (option) {
    if (*option < least) {
      throw Error(Errc::invalid_argument,
                  fmt::format("{}={} is not {}", axis_name(axis), *option, meaning));
    }
    return *option;
  }
  const std::string knob = fmt::format("BRAID_{}", axis == Axis::tp   ? "TP"
                                                   : axis == Axis::cp ? "CP"
                                                   : axis == Axis::dp ? "DP"
                                                                      : "PP");
  const std::int64_t value = config::int_value(knob, env);
  if (value < least || value > std::numeric_limits<int>::max()) {
    throw Error(Errc::invalid_environment, fmt::format("{}={} is not {}", knob, value, meaning));
  }
  return static_cast<int>(value);
}

}  // namespace

std::string_view axis_name(Axis axis) noexcept {
  switch (axis) {
    case Axis::tp:
      return "tp";
    case Axis::cp:
      return "cp";
    case Axis::dp:
      return "dp";
    case Axis::pp:
      return "pp";
  }
  return "?";
}

Axes Axes::parse(std::string_view text) {
  Axes axes;
  for (Axis axis : parse_axis_list(text, Errc::invalid_argument, "axes", "a group")) {
    axes.mask_ |= bit(axis);
  }
  return axes;
}

std::string Axes::name() const {
  std::string out;
  for (Axis axis : all_axes) {
    if (!contains(axis)) continue;
    if (!out.empty()) out += '-';
    out += axis_name(axis);
  }
  return out.empty() ? "none" : out;
}

std::vector<Axis> parse_order(std::string_view text, Errc code, std::string_view what) {
  return parse_axis_list(text, code, what, "an order");
}

GridSpec GridSpec::from_options(const GridOptions& options, const config::EnvLookup& env) {
  GridSpec spec;
  spec.degrees = {degree_of(Axis::tp, options.tp, env), degree_of(Axis::cp, options.cp, env),
                  degree_of(Axis::dp, options.dp, env), degree_of(Axis::pp, options.pp, env)};
  spec.order = options.order ? parse_order(*options.order, Errc::invalid_argument, "order")
                             : parse_order(config::string_value("BRAID_GRID_ORDER", env),
                                           Errc::invalid_environment, "BRAID_GRID_ORDER");
  return spec;
}

int GridSpec::resolved_dp(int world_size) const noexcept {
  if (degree(Axis::dp) != 0) return degree(Axis::dp);
  // Stops once the product passes the world, which it then cannot divide: three ints
  // multiplied could overflow 64 bits.
  std::int64_t others = 1;
  for (Axis axis : {Axis::tp, Axis::cp, Axis::pp}) {
    others *= degree(axis);
    if (others > world_size) return 0;
  }
  if (world_size <= 0 || world_size % others != 0) return 0;
  return static_cast<int>(world_size / others);
}

std::string GridSpec::describe() const {
  std::string order_text;
  for (Axis axis : order) {
    if (!order_text.empty()) order_text += '-';
    order_text += axis_name(axis);
  }
  const std::string dp = degree(Axis::dp) == 0 ? "auto" : fmt::format("{}", degree(Axis::dp));
  return fmt::format("tp={} cp={} dp={} pp={} order {}", degree(Axis::tp), degree(Axis::cp), dp,
                     degree(Axis::pp), order_text);
}

bool GridSpec::same_layout(const GridSpec& other) const noexcept {
  if (degrees != other.degrees) return false;
  // The named axes that move ranks, in order; the rest of the array stays at its fill.
  auto moving = [](const GridSpec& spec) {
    std::array<int, axis_count> axes{-1, -1, -1, -1};
    std::size_t n = 0;
    for (Axis axis : spec.order) {
      if (spec.degree(axis) != 1 && n < axes.size()) axes[n++] = static_cast<int>(axis);
    }
    return axes;
  };
  return moving(*this) == moving(other);
}

}  // namespace braid::parallel
