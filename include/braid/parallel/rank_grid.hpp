// RankGrid: this rank's place in the grid of 3D (4D, with context) parallelism, and the
// communicators of its groups: the tensor-, context-, data- and pipeline-parallel groups,
// any combination of them, and the embedding groups of pipeline parallelism.
//
//   auto world = braid::collectives::Communicator::world(*joined);
//   runtime.spawn([&]() -> asio::awaitable<void> {
//     auto grid = co_await braid::parallel::RankGrid::create(world, {.tp = 2, .pp = 2});
//     auto tp = co_await grid->group(Axis::tp);              // made here, collectively
//     auto dp_cp = co_await grid->group({Axis::dp, Axis::cp});   // or group("dp-cp")
//     co_await tp->all_reduce(Buffer(partial), ReduceOp::sum);
//     if (grid->is_last_stage()) { ... }
//   }()).get();
//
// The ranks and groups are GridLayout's (grid_layout.hpp), Megatron-Core's layout: ranks
// here are the given communicator's ranks (the world's, for the world communicator; error
// messages name world ranks), and a group communicator orders its members by them, so its
// rank r is members(axes)[r].
//
// Collective calls, and what they check (the part Megatron-Core and PyTorch's DeviceMesh
// leave to luck: ranks that disagree there hang in a split, or pair up wrongly):
//  - create() is collective over `world`. Each rank reads its grid (options, then the
//    BRAID_TP/CP/DP/PP and BRAID_GRID_ORDER knobs) and all ranks exchange what they read,
//    or the error they met, in one all-gather before anything is validated. A rank whose
//    environment is malformed, or whose grid differs from rank 0's (the same degrees, and
//    the same order of the axes above degree 1), makes every rank fail at once with an
//    error naming the rank(s) and both grids.
//  - The first request for a group (group(), embedding_group(), position_embedding_group())
//    is collective over `world`: every rank must make the same groups in the same order,
//    as Megatron-Core's initialize_model_parallel makes every group on every rank. Before
//    splitting, ranks exchange which group they are making; ranks asking for different
//    groups all fail with Errc::desync, naming the ranks and both groups, and no split is
//    made (the grid stays usable). A rank that stops asking while others ask leaves them
//    waiting until the communicator's timeout. Later requests for a made group return the
//    same communicator without communicating.
//
// Threading. create() and the group requests are awaitables on the world communicator's
// runtime; make groups from one coroutine at a time (two requests in flight at once would
// interleave their exchanges). The other members are const and may be called from any
// thread. The world communicator must outlive the grid.
//
// Costs. create(): one all-gather of 256 bytes per rank. A group's first request: one
// all-gather of 4 bytes per rank, then Communicator::split (an all-gather of (color, key)
// and a broadcast of names from the store). Everything else is arithmetic on this rank's
// coordinates (O(1); member lists O(group size)).
//
// Errors (braid::Error, context: this rank's world rank and "RankGrid"):
//   Errc::invalid_environment  a BRAID_TP/CP/DP/PP or BRAID_GRID_ORDER value some rank could
//                              not read (every rank reports it, naming the rank and variable)
//   Errc::invalid_argument     an option some rank could not accept; ranks with different
//                              grids; degrees whose product is not the world's size, or a dp
//                              that cannot be inferred; an order leaving out an axis of degree
//                              above 1; a group of no axes, or a malformed axis list (every
//                              rank fails: the request is exchanged like any other)
//   Errc::desync               ranks asked for different groups at the same point
//   and the world communicator's own errors (timeout, peer_failed) from the exchanges.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include <braid/collectives/communicator.hpp>
#include <braid/core/config.hpp>
#include <braid/parallel/grid_layout.hpp>
#include <braid/parallel/grid_spec.hpp>

namespace braid::parallel {

class RankGrid {
 public:
  // Collective over `world` (see above). `env` is where unset options are read from.
  static asio::awaitable<std::unique_ptr<RankGrid>> create(
      std::shared_ptr<collectives::Communicator> world, GridOptions options = {},
      config::EnvLookup env = config::process_env());

  RankGrid(const RankGrid&) = delete;
  RankGrid& operator=(const RankGrid&) = delete;

  const GridLayout& layout() const noexcept { return layout_; }
  const std::shared_ptr<collectives::Communicator>& world() const noexcept { return world_; }
  // This rank in `world`.
  int rank() const noexcept { return rank_; }
  int degree(Axis axis) const noexcept { return layout_.degree(axis); }
  int coordinate(Axis axis) const noexcept { return coordinates_[static_cast<std::size_t>(axis)]; }
  // "tp=2 cp=1 dp=2 pp=4 order tp-cp-dp-pp".
  std::string describe() const { return layout_.describe(); }

  // The members of this rank's group of `axes`, ascending (GridLayout::members).
  std::vector<int> members(Axes axes) const { return layout_.members(axes, rank_); }

  // ---- this rank's pipeline
  int stage() const noexcept { return coordinate(Axis::pp); }
  bool is_first_stage() const noexcept { return stage() == 0; }
  bool is_last_stage() const noexcept { return stage() == degree(Axis::pp) - 1; }
  // Ranks holding the next and previous stage; wrapping around at the ends as Megatron-Core's
  // get_pipeline_model_parallel_next_rank / _prev_rank do (GridLayout::next_stage_rank).
  int next_stage_rank() const { return layout_.next_stage_rank(rank_); }
  int previous_stage_rank() const { return layout_.previous_stage_rank(rank_); }
  // The first and last stage of this rank's pipeline (one rank where pp = 1), and the first
  // stage alone: who holds the tied embeddings and the position embeddings.
  std::vector<int> embedding_members() const { return layout_.embedding_members(rank_); }
  std::vector<int> position_embedding_members() const {
    return layout_.position_embedding_members(rank_);
  }

  // ---- groups, made collectively on first request (see above), then cached
  // The communicator of this rank's group of `axes`: group(Axis::tp), group({Axis::tp,
  // Axis::dp}), group("tp-dp") (names in any order). An axis of degree 1 still makes a
  // group: of one rank, where it is the only axis.
  asio::awaitable<std::shared_ptr<collectives::Communicator>> group(Axes axes);
  asio::awaitable<std::shared_ptr<collectives::Communicator>> group(std::string axes);
  // The first and last stage of this rank's pipeline; nullptr on the ranks in between.
  asio::awaitable<std::shared_ptr<collectives::Communicator>> embedding_group();
  // The first stage of this rank's pipeline (a communicator of one rank); nullptr elsewhere.
  asio::awaitable<std::shared_ptr<collectives::Communicator>> position_embedding_group();

 private:
  RankGrid(std::shared_ptr<collectives::Communicator> world, GridLayout layout);

  // What a rank asks for, as exchanged: a kind and, for kind `axes`, the set's mask.
  enum class Request : std::uint8_t { axes, embedding, position_embedding, malformed };
  static std::int32_t request_code(Request kind, Axes axes = {}) noexcept;
  static std::string request_name(std::int32_t code);
  // The group `code` names, made (collectively) or from the cache. `malformed`: why this
  // rank's request could not be read (code says Request::malformed).
  asio::awaitable<std::shared_ptr<collectives::Communicator>> obtain(std::int32_t code,
                                                                     std::string malformed);
  [[noreturn]] void fail(Errc code, std::string detail) const;

  std::shared_ptr<collectives::Communicator> world_;
  GridLayout layout_;
  int rank_;
  GridLayout::Coordinates coordinates_;
  // Made groups by request code; a null communicator is a made group this rank is not in.
  std::map<std::int32_t, std::shared_ptr<collectives::Communicator>> groups_;
};

}  // namespace braid::parallel
