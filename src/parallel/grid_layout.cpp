// GridLayout (grid_layout.hpp): Megatron-Core's rank generator as arithmetic on strides.
#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/parallel/grid_layout.hpp>

namespace braid::parallel {
namespace {

[[noreturn]] void invalid(std::string detail) {
  throw Error(Errc::invalid_argument, std::move(detail));
}

std::string order_text(std::span<const Axis> order) {
  std::string out;
  for (Axis axis : order) {
    if (!out.empty()) out += '-';
    out += axis_name(axis);
  }
  return out;
}

}  // namespace

GridLayout::GridLayout(int world_size, const GridSpec& spec)
    : world_size_(world_size), named_order_(spec.order) {
  if (world_size < 1)
    invalid(fmt::format("a grid needs a world of at least 1 rank, not {}", world_size));
  for (Axis axis : all_axes) {
    const int least = axis == Axis::dp ? 0 : 1;
    if (spec.degree(axis) < least) {
      invalid(fmt::format("{}={} is not a degree (at least 1{})", axis_name(axis),
                          spec.degree(axis), axis == Axis::dp ? ", or 0 to infer it" : ""));
    }
    degrees_[index(axis)] = spec.degree(axis);
  }
  if (spec.degree(Axis::dp) == 0) {
    degrees_[index(Axis::dp)] = spec.resolved_dp(world_size);
    if (degree(Axis::dp) == 0) {
      invalid(fmt::format(
          "dp cannot be inferred: the world's {} ranks are not a multiple of tp*cp*pp (tp={} "
          "cp={} pp={})",
          world_size, degree(Axis::tp), degree(Axis::cp), degree(Axis::pp)));
    }
  }
  std::int64_t product = 1;
  bool overflow = false;
  for (int d : degrees_) overflow = overflow || __builtin_mul_overflow(product, d, &product);
  if (overflow || product != world_size) {
    invalid(fmt::format("tp={} cp={} dp={} pp={} make {} ranks, but the world has {}",
                        degree(Axis::tp), degree(Axis::cp), degree(Axis::dp), degree(Axis::pp),
                        overflow ? std::string("more than 2^63") : fmt::format("{}", product),
                        world_size));
  }

  // The named axes first, then those left out, which must not move any rank.
  std::size_t n = 0;
  for (Axis axis : named_order_) {
    if (std::count(named_order_.begin(), named_order_.end(), axis) != 1 || n == order_.size()) {
      invalid(fmt::format("order {} names {} twice", order_text(named_order_), axis_name(axis)));
    }
    order_[n++] = axis;
  }
  for (Axis axis : all_axes) {
    if (std::find(named_order_.begin(), named_order_.end(), axis) != named_order_.end()) continue;
    if (degree(axis) != 1) {
      invalid(fmt::format(
          "order {} leaves out {}, whose degree is {}: an order names every axis "
          "of degree above 1",
          named_order_.empty() ? "''" : order_text(named_order_), axis_name(axis), degree(axis)));
    }
    order_[n++] = axis;
  }
  int stride = 1;
  for (Axis axis : order_) {
    strides_[index(axis)] = stride;
    stride *= degree(axis);
  }
}

std::string GridLayout::describe() const {
  return fmt::format("tp={} cp={} dp={} pp={} order {}", degree(Axis::tp), degree(Axis::cp),
                     degree(Axis::dp), degree(Axis::pp), order_text(named_order_));
}

void GridLayout::check_rank(int rank) const {
  if (rank < 0 || rank >= world_size_) {
    invalid(
        fmt::format("rank {} is outside the grid's {} ranks ({})", rank, world_size_, describe()));
  }
}

void GridLayout::check_axes(Axes axes) const {
  if (axes.empty()) invalid("a group spans at least one axis; this set names none");
}

GridLayout::Coordinates GridLayout::coordinates(int rank) const {
  check_rank(rank);
  Coordinates out{};
  for (Axis axis : all_axes) out[index(axis)] = rank / strides_[index(axis)] % degree(axis);
  return out;
}

int GridLayout::rank_at(const Coordinates& coordinates) const {
  int rank = 0;
  for (Axis axis : all_axes) {
    const int c = coordinates[index(axis)];
    if (c < 0 || c >= degree(axis)) {
      invalid(
          fmt::format("coordinate {}={} is outside the grid ({})", axis_name(axis), c, describe()));
    }
    rank += c * strides_[index(axis)];
  }
  return rank;
}

int GridLayout::group_size(Axes axes) const {
  check_axes(axes);
  int size = 1;
  for (Axis axis : all_axes) {
    if (axes.contains(axis)) size *= degree(axis);
  }
  return size;
}

std::vector<int> GridLayout::members(Axes axes, int rank) const {
  const int size = group_size(axes);
  // The group's first rank: this rank with its coordinates on `axes` at 0.
  const Coordinates mine = coordinates(rank);
  int base = rank;
  for (Axis axis : all_axes) {
    if (axes.contains(axis)) base -= mine[index(axis)] * strides_[index(axis)];
  }
  // Member j's coordinates on `axes` are j's digits in their mixed radix, fastest axis
  // first; strides grow along the order, so the members come out ascending.
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(size));
  for (int j = 0; j < size; ++j) {
    int rest = j, member = base;
    for (Axis axis : order_) {
      if (!axes.contains(axis)) continue;
      member += rest % degree(axis) * strides_[index(axis)];
      rest /= degree(axis);
    }
    out.push_back(member);
  }
  return out;
}

int GridLayout::group_index(Axes axes, int rank) const {
  check_axes(axes);
  const Coordinates mine = coordinates(rank);
  int group = 0, place = 1;
  for (Axis axis : order_) {
    if (axes.contains(axis)) continue;
    group += mine[index(axis)] * place;
    place *= degree(axis);
  }
  return group;
}

std::vector<std::vector<int>> GridLayout::groups(Axes axes) const {
  const int count = group_count(axes);
  std::vector<std::vector<int>> out;
  out.reserve(static_cast<std::size_t>(count));
  for (int group = 0; group < count; ++group) {
    // The group's coordinates off `axes` are its index's digits, fastest axis first.
    Coordinates at{};
    int rest = group;
    for (Axis axis : order_) {
      if (axes.contains(axis)) continue;
      at[index(axis)] = rest % degree(axis);
      rest /= degree(axis);
    }
    out.push_back(members(axes, rank_at(at)));
  }
  return out;
}

int GridLayout::next_stage_rank(int rank) const {
  Coordinates at = coordinates(rank);
  at[index(Axis::pp)] = (at[index(Axis::pp)] + 1) % degree(Axis::pp);
  return rank_at(at);
}

int GridLayout::previous_stage_rank(int rank) const {
  Coordinates at = coordinates(rank);
  at[index(Axis::pp)] = (at[index(Axis::pp)] + degree(Axis::pp) - 1) % degree(Axis::pp);
  return rank_at(at);
}

std::vector<int> GridLayout::embedding_members(int rank) const {
  Coordinates at = coordinates(rank);
  at[index(Axis::pp)] = 0;
  const int first = rank_at(at);
  if (degree(Axis::pp) == 1) return {first};
  at[index(Axis::pp)] = degree(Axis::pp) - 1;
  return {first, rank_at(at)};
}

std::vector<int> GridLayout::position_embedding_members(int rank) const {
  Coordinates at = coordinates(rank);
  at[index(Axis::pp)] = 0;
  return {rank_at(at)};
}

}  // namespace braid::parallel
