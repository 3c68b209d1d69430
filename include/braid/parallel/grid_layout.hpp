// GridLayout: where each rank of a world sits in the grid of parallel axes (tp, cp, dp, pp;
// grid_spec.hpp), and which ranks form each group. Pure arithmetic, no communicator: every
// rank computes the same answers alone. RankGrid (rank_grid.hpp) makes communicators of it.
//
// The layout is Megatron-Core's (parallel_state.py, RankGenerator and
// generate_masked_orthogonal_rank_groups), so a job may mix both. With the order's axes
// a0 a1 a2 a3, fastest first,
//   rank = c0 + d0 * (c1 + d1 * (c2 + d2 * c3))     (ci: coordinate, di: degree on axis ai)
// Axes of degree 1 the order left out come last; they move no rank. The group of a set of
// axes through a rank is every rank that shares its coordinates on all other axes, in
// ascending rank order (which is also the order of their coordinates on the set's axes,
// fastest first). Groups of one set are numbered by the coordinates they share, read as a
// number in the same mixed radix (fastest axis first): group_index.
//
// Megatron-Core's example, 16 ranks with tp=2 pp=4 (dp=2), order tp-cp-dp-pp:
//   GridLayout grid(16, GridSpec{.degrees = {2, 1, 2, 4}});   // tp, cp, dp, pp
//   grid.coordinates(5) == {1, 0, 0, 1};  grid.members(Axis::dp, 5) == {5, 7};
//   tp groups:  [0,1] [2,3] [4,5] [6,7] [8,9] [10,11] [12,13] [14,15]
//   dp groups:  [0,2] [1,3] [4,6] [5,7] [8,10] [9,11] [12,14] [13,15]
//   pp groups:  [0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15]
//   embedding groups (first and last stage): [0,12] [1,13] [2,14] [3,15]
//   position-embedding groups (first stage): [0] [1] [2] [3]
//
// Costs: construction O(1); each query O(axes), members() O(group size), groups() O(world).
// Errors: braid::Error(Errc::invalid_argument) at construction when the degrees do not
// multiply to the world (naming the degrees and the world), dp cannot be inferred, or the
// order repeats an axis or leaves out one whose degree is above 1; at a query for a rank
// or coordinate outside the grid, or an empty set of axes.
#pragma once

#include <array>
#include <span>
#include <string>
#include <vector>

#include <braid/parallel/grid_spec.hpp>

namespace braid::parallel {

class GridLayout {
 public:
  // Indexed by Axis.
  using Coordinates = std::array<int, axis_count>;

  GridLayout(int world_size, const GridSpec& spec);

  int world_size() const noexcept { return world_size_; }
  int degree(Axis axis) const noexcept { return degrees_[index(axis)]; }
  // All four axes, fastest first: the order's, then the degree-1 axes it left out.
  std::span<const Axis> order() const noexcept { return order_; }
  // "tp=2 cp=1 dp=2 pp=4 order tp-cp-dp-pp" (the order as it was named).
  std::string describe() const;

  Coordinates coordinates(int rank) const;
  int coordinate(int rank, Axis axis) const { return coordinates(rank)[index(axis)]; }
  int rank_at(const Coordinates& coordinates) const;

  // The group of `axes` through `rank`: ranks sharing its coordinates off those axes,
  // ascending.
  std::vector<int> members(Axes axes, int rank) const;
  // How many ranks each group of `axes` holds, and how many such groups there are.
  int group_size(Axes axes) const;
  int group_count(Axes axes) const { return world_size_ / group_size(axes); }
  // Which of the groups of `axes` holds `rank`: 0 .. group_count - 1, as numbered above.
  int group_index(Axes axes, int rank) const;
  // Every group of `axes`, by group_index; together they hold every rank once.
  std::vector<std::vector<int>> groups(Axes axes) const;

  // ---- the pipeline through a rank: its pp group, stage 0 first
  int stage(int rank) const { return coordinate(rank, Axis::pp); }
  bool is_first_stage(int rank) const { return stage(rank) == 0; }
  bool is_last_stage(int rank) const { return stage(rank) == degree(Axis::pp) - 1; }
  // The ranks holding the next and previous stage. They wrap around, as Megatron-Core's
  // get_pipeline_model_parallel_next_rank / _prev_rank do: the last stage's next is the
  // first stage, the first stage's previous the last; with pp = 1 both are the rank itself.
  int next_stage_rank(int rank) const;
  int previous_stage_rank(int rank) const;
  // The first and last stage of the pipeline through `rank` (the ranks holding the tied
  // input and output embeddings); one rank where pp = 1. `rank` need not be one of them.
  std::vector<int> embedding_members(int rank) const;
  bool in_embedding_group(int rank) const { return is_first_stage(rank) || is_last_stage(rank); }
  // The first stage of the pipeline through `rank` (the position embeddings).
  std::vector<int> position_embedding_members(int rank) const;
  bool in_position_embedding_group(int rank) const { return is_first_stage(rank); }

 private:
  static std::size_t index(Axis axis) noexcept { return static_cast<std::size_t>(axis); }
  void check_rank(int rank) const;
  void check_axes(Axes axes) const;

  int world_size_;
  Coordinates degrees_{};
  std::array<Axis, axis_count> order_{};
  std::vector<Axis> named_order_;
  Coordinates strides_{};  // by Axis: the rank distance between neighbours on that axis
};

}  // namespace braid::parallel
