// What a rank grid is asked to be: the degree of each parallel axis and the order the axes
// are laid out in, before it meets a world. The axes are braid's names for Megatron-Core's:
//   tp  tensor parallel: ranks that split each layer's tensors
//   cp  context parallel: ranks that split the sequence
//   dp  data parallel: ranks that hold the same model and split the batch
//   pp  pipeline parallel: ranks that hold consecutive stages of the model
//
//   auto spec = braid::parallel::GridSpec::from_options({.tp = 2, .pp = 4});
//   // dp, the order: from BRAID_DP and BRAID_GRID_ORDER, else dp = world / (tp*cp*pp) and
//   // the order "tp-cp-dp-pp"
//   braid::parallel::GridLayout layout(16, spec);   // grid_layout.hpp: the ranks' places
//
// The order string names axes from the fastest-varying to the slowest ("tp-cp-dp-pp": a
// rank's TP partners are its neighbours in rank order, so on one node, and its pipeline
// stages lie furthest apart, as Megatron-Core's default "tp-cp-ep-dp-pp" without ep). It
// must name every axis whose degree is above 1; axes of degree 1 may be left out.
//
// Errors (braid::Error), thrown at the call:
//   Errc::invalid_argument     an option that is not a degree (below 1; dp below 0), an order
//                              or axis list with an unknown, repeated or missing name
//   Errc::invalid_environment  the same read from BRAID_TP, BRAID_CP, BRAID_DP, BRAID_PP or
//                              BRAID_GRID_ORDER (src/core/config.cpp), naming the variable
// Costs: a few environment reads; nothing is allocated per rank.
#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>

namespace braid::parallel {

enum class Axis : std::uint8_t { tp, cp, dp, pp };

inline constexpr int axis_count = 4;
// Every axis, in the default order.
inline constexpr std::array<Axis, axis_count> all_axes{Axis::tp, Axis::cp, Axis::dp, Axis::pp};

// "tp", "cp", "dp", "pp".
std::string_view axis_name(Axis axis) noexcept;

// A set of axes: which ones a group spans. Axes{Axis::tp, Axis::dp} and Axes::parse("dp-tp")
// are the same set; sets are unordered.
class Axes {
 public:
  constexpr Axes() noexcept = default;
  // Axes(Axis::tp), Axes{Axis::tp, Axis::dp}; implicit, so group(Axis::tp) and
  // group({Axis::tp, Axis::dp}) read as they should. Not an initializer_list: GCC 12 cannot
  // keep one's array in a coroutine frame ("array used as initializer") when the braces
  // sit in a co_await expression.
  template <std::same_as<Axis>... More>
  constexpr Axes(Axis first, More... more) noexcept  // NOLINT: implicit on purpose
      : mask_(static_cast<std::uint8_t>((bit(first) | ... | bit(more)))) {}
  // Axis names joined by '-', in any order ("tp", "tp-dp", "pp-cp"). Throws
  // Error(invalid_argument) for an empty list or an unknown or repeated name.
  static Axes parse(std::string_view text);
  // The set whose bit 1 << int(axis) is set for each member; bits above the axes are ignored.
  static constexpr Axes from_mask(std::uint8_t mask) noexcept {
    Axes axes;
    axes.mask_ = static_cast<std::uint8_t>(mask & ((1u << axis_count) - 1));
    return axes;
  }

  constexpr bool contains(Axis axis) const noexcept { return (mask_ & bit(axis)) != 0; }
  constexpr bool empty() const noexcept { return mask_ == 0; }
  constexpr std::uint8_t mask() const noexcept { return mask_; }
  // The members in the default order, joined by '-' ("tp-dp"); "none" for the empty set.
  std::string name() const;

  friend constexpr bool operator==(Axes, Axes) noexcept = default;

 private:
  static constexpr std::uint8_t bit(Axis axis) noexcept {
    return static_cast<std::uint8_t>(1u << static_cast<unsigned>(axis));
  }
  std::uint8_t mask_ = 0;
};

// Degrees as arguments; what is left unset comes from the environment.
struct GridOptions {
  std::optional<int> tp;  // nullopt: BRAID_TP (default 1)
  std::optional<int> cp;  // nullopt: BRAID_CP (default 1)
  std::optional<int> dp;  // nullopt: BRAID_DP (default 0); 0: world / (tp * cp * pp)
  std::optional<int> pp;  // nullopt: BRAID_PP (default 1)
  // Fastest axis first, e.g. "tp-dp-pp"; nullopt: BRAID_GRID_ORDER (default "tp-cp-dp-pp").
  std::optional<std::string> order;
};

struct GridSpec {
  // Indexed by Axis. dp may be 0: the world's size divided by the other three.
  std::array<int, axis_count> degrees{1, 1, 0, 1};
  // The axes as the order string named them, fastest first; unique.
  std::vector<Axis> order{all_axes.begin(), all_axes.end()};

  // The options' values, and the environment's where an option is unset.
  static GridSpec from_options(const GridOptions& options = {},
                               const config::EnvLookup& env = config::process_env());

  int degree(Axis axis) const noexcept { return degrees[static_cast<std::size_t>(axis)]; }
  // dp as given, or world_size / (tp * cp * pp) where dp is 0 and that divides evenly;
  // 0 where it does not.
  int resolved_dp(int world_size) const noexcept;
  // "tp=2 cp=1 dp=2 pp=4 order tp-cp-dp-pp" ("dp=auto" while dp is 0).
  std::string describe() const;
  // Whether two specs place every rank alike: the same degrees, and the same order once
  // the axes of degree 1 (which move no rank) are left out.
  bool same_layout(const GridSpec& other) const noexcept;
};

// An order string's axes, fastest first ("tp-cp-dp-pp"). Unknown, repeated or empty names
// are an Error(code) whose message starts with `what` (the option or variable read).
std::vector<Axis> parse_order(std::string_view text, Errc code, std::string_view what);

}  // namespace braid::parallel
