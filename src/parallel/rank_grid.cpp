// RankGrid (rank_grid.hpp): the grid's collective checks and the group cache. Every
// verdict below is reached from exchanged data that is the same on every rank, so the ranks
// pass or fail together instead of some waiting in a split the others never join.
#include <algorithm>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include <braid/core/buffer.hpp>
#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>
#include <braid/core/log.hpp>
#include <braid/parallel/rank_grid.hpp>

namespace braid::parallel {
namespace {

using collectives::Communicator;

// One rank's grid as the others receive it: what it read, or the error it met reading it.
struct GridRecord {
  std::int32_t degrees[axis_count];
  std::int32_t order[axis_count];  // the named axes, then -1
  std::int32_t error;              // 0, or the Errc this rank met
  char message[220];               // that error's detail, cut to fit, NUL-terminated
};
static_assert(sizeof(GridRecord) == 256);

GridRecord record_of(const GridSpec& spec) {
  GridRecord record{};
  for (std::size_t i = 0; i < axis_count; ++i) {
    record.degrees[i] = spec.degrees[i];
    record.order[i] = i < spec.order.size() ? static_cast<std::int32_t>(spec.order[i]) : -1;
  }
  return record;
}

GridRecord record_of(const Error& error) {
  GridRecord record{};
  const bool ours = error.code().category() == braid_category();
  record.error = ours ? error.code().value() : static_cast<std::int32_t>(Errc::invalid_argument);
  const std::string& detail = error.detail();
  std::memcpy(record.message, detail.data(), std::min(detail.size(), sizeof(record.message) - 1));
  return record;
}

GridSpec spec_of(const GridRecord& record) {
  GridSpec spec;
  spec.order.clear();
  for (std::size_t i = 0; i < axis_count; ++i) {
    spec.degrees[i] = record.degrees[i];
    if (record.order[i] >= 0 && record.order[i] < axis_count) {
      spec.order.push_back(static_cast<Axis>(record.order[i]));
    }
  }
  return spec;
}

std::string message_of(const GridRecord& record) {
  return std::string(record.message, strnlen(record.message, sizeof(record.message)));
}

// "rank 3", "ranks 1 and 3", "ranks 1, 2, 3, 5 and 4 more".
std::string ranks_text(const std::vector<int>& ranks) {
  constexpr std::size_t shown = 4;
  if (ranks.size() == 1) return fmt::format("rank {}", ranks[0]);
  std::string out = "ranks ";
  for (std::size_t i = 0; i < ranks.size() && i < shown; ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += fmt::format("{}", ranks[i]);
  }
  if (ranks.size() > shown) out += fmt::format(" and {} more", ranks.size() - shown);
  return out;
}

// Tensor (and context) parallelism talks in every layer, forward and backward: its groups
// belong inside a node, where shared memory (or NVLink) carries it, and pipeline and data
// parallelism across nodes, which talk once a microbatch or once a step. A layout that
// puts a tp or cp group across nodes still works, at network speed; say so, once.
void warn_of_groups_across_nodes(const Communicator& world, const GridLayout& layout,
                                 const GridSpec& spec) {
  const collectives::HierarchyPlan& nodes = world.hierarchy();
  if (nodes.nodes < 2) return;
  for (const Axis axis : {Axis::tp, Axis::cp}) {
    if (spec.degrees[static_cast<std::size_t>(axis)] < 2) continue;
    for (const std::vector<int>& group : layout.groups(Axes{axis})) {
      const int node = nodes.node_of[static_cast<std::size_t>(group.front())];
      const bool spans = std::any_of(group.begin(), group.end(), [&](int r) {
        return nodes.node_of[static_cast<std::size_t>(r)] != node;
      });
      if (!spans) continue;
      std::vector<int> named;
      for (int r : group) named.push_back(world.world_rank(r));
      log::warn(
          "RankGrid {}: the {} group of {} spans nodes, so its traffic, every layer's, "
          "crosses the network; with {} rank(s) per node, keep {} at most that and first "
          "in the order, so that its groups fall inside nodes",
          spec.describe(), axis_name(axis), ranks_text(named), nodes.local_group.size(),
          axis_name(axis));
      break;
    }
  }
}

[[noreturn]] void fail_on(const Communicator& world, Errc code, std::string detail) {
  throw Error(code, std::move(detail),
              ErrorContext{.rank = world.world_rank(world.rank()), .operation = "RankGrid"});
}

}  // namespace

asio::awaitable<std::unique_ptr<RankGrid>> RankGrid::create(std::shared_ptr<Communicator> world,
                                                            GridOptions options,
                                                            config::EnvLookup env) {
  BRAID_ENFORCE(world != nullptr, "RankGrid::create needs a communicator");
  const int size = world->size(), me = world->rank();
  const auto world_rank = [&](int r) { return world->world_rank(r); };

  // Read locally, then exchange before judging: a rank that failed to read its grid still
  // takes part, so that nobody waits for it.
  std::vector<GridRecord> records(static_cast<std::size_t>(size));
  try {
    GridSpec spec = GridSpec::from_options(options, env);
    // dp inferred here where it can be, so "dp=0" and the dp it stands for compare equal.
    spec.degrees[static_cast<std::size_t>(Axis::dp)] = spec.resolved_dp(size);
    records[static_cast<std::size_t>(me)] = record_of(spec);
  } catch (const Error& e) {
    records[static_cast<std::size_t>(me)] = record_of(e);
  }
  co_await world->all_gather(
      Buffer(records.data(), records.size() * sizeof(GridRecord), DType::u8));

  std::vector<int> failed;
  for (int r = 0; r < size; ++r) {
    if (records[static_cast<std::size_t>(r)].error != 0) failed.push_back(r);
  }
  if (!failed.empty()) {
    std::string detail;
    if (failed.size() == 1) {
      detail = fmt::format("rank {} could not read its grid: {}", world_rank(failed[0]),
                           message_of(records[static_cast<std::size_t>(failed[0])]));
    } else {
      std::vector<int> named;
      for (int r : failed) named.push_back(world_rank(r));
      detail = fmt::format("{} could not read their grids", ranks_text(named));
      for (std::size_t i = 0; i < failed.size() && i < 4; ++i) {
        detail += fmt::format("{} rank {}: {}", i == 0 ? ":" : ";", world_rank(failed[i]),
                              message_of(records[static_cast<std::size_t>(failed[i])]));
      }
    }
    fail_on(*world, static_cast<Errc>(records[static_cast<std::size_t>(failed[0])].error),
            std::move(detail));
  }

  const GridSpec first = spec_of(records[0]);
  std::vector<int> differing;
  for (int r = 1; r < size; ++r) {
    if (!spec_of(records[static_cast<std::size_t>(r)]).same_layout(first)) differing.push_back(r);
  }
  if (!differing.empty()) {
    // Each rank names its own grid where it is one that differs, else the first that does.
    const bool mine_differs = std::find(differing.begin(), differing.end(), me) != differing.end();
    const int shown = mine_differs ? me : differing[0];
    std::string detail =
        fmt::format("rank {}'s grid {} differs from rank {}'s {}", world_rank(shown),
                    spec_of(records[static_cast<std::size_t>(shown)]).describe(), world_rank(0),
                    first.describe());
    if (differing.size() > 1) {
      std::vector<int> named;
      for (int r : differing) named.push_back(world_rank(r));
      detail += fmt::format(" ({} differ from rank {})", ranks_text(named), world_rank(0));
    }
    fail_on(*world, Errc::invalid_argument,
            std::move(detail) + "; every rank must ask for the same grid");
  }

  // Every rank holds the same spec now, so every rank reaches the same verdict here.
  std::optional<GridLayout> layout;
  try {
    layout.emplace(size, first);
  } catch (const Error& e) {
    fail_on(*world, static_cast<Errc>(e.code().value()), e.detail());
  }
  if (me == 0) warn_of_groups_across_nodes(*world, *layout, first);
  co_return std::unique_ptr<RankGrid>(new RankGrid(std::move(world), std::move(*layout)));
}

RankGrid::RankGrid(std::shared_ptr<Communicator> world, GridLayout layout)
    : world_(std::move(world)),
      layout_(std::move(layout)),
      rank_(world_->rank()),
      coordinates_(layout_.coordinates(rank_)) {}

std::int32_t RankGrid::request_code(Request kind, Axes axes) noexcept {
  return static_cast<std::int32_t>(static_cast<unsigned>(kind) << 8 | axes.mask());
}

std::string RankGrid::request_name(std::int32_t code) {
  switch (static_cast<Request>(code >> 8)) {
    case Request::axes:
      return fmt::format("the {} group", Axes::from_mask(static_cast<std::uint8_t>(code)).name());
    case Request::embedding:
      return "the embedding group";
    case Request::position_embedding:
      return "the position-embedding group";
    case Request::malformed:
      break;
  }
  return "a malformed group";
}

void RankGrid::fail(Errc code, std::string detail) const {
  fail_on(*world_, code, std::move(detail));
}

asio::awaitable<std::shared_ptr<Communicator>> RankGrid::group(Axes axes) {
  if (axes.empty()) {
    co_return co_await obtain(request_code(Request::malformed),
                              "a group spans at least one axis; this set names none");
  }
  co_return co_await obtain(request_code(Request::axes, axes), {});
}

asio::awaitable<std::shared_ptr<Communicator>> RankGrid::group(std::string axes) {
  std::optional<Axes> parsed;
  std::string why;
  try {
    parsed = Axes::parse(axes);
  } catch (const Error& e) {
    why = e.detail();
  }
  if (!parsed) co_return co_await obtain(request_code(Request::malformed), std::move(why));
  co_return co_await group(*parsed);
}

asio::awaitable<std::shared_ptr<Communicator>> RankGrid::embedding_group() {
  co_return co_await obtain(request_code(Request::embedding), {});
}

asio::awaitable<std::shared_ptr<Communicator>> RankGrid::position_embedding_group() {
  co_return co_await obtain(request_code(Request::position_embedding), {});
}

asio::awaitable<std::shared_ptr<Communicator>> RankGrid::obtain(std::int32_t code,
                                                                std::string malformed) {
  const bool is_malformed = code >> 8 == static_cast<std::int32_t>(Request::malformed);
  if (auto made = groups_.find(code); made != groups_.end()) co_return made->second;

  // Which group each rank is making, before any split: a disagreement is reported, not
  // split on.
  std::vector<std::int32_t> codes(static_cast<std::size_t>(world_->size()));
  codes[static_cast<std::size_t>(rank_)] = code;
  co_await world_->all_gather(Buffer(codes));

  const auto world_rank = [&](int r) { return world_->world_rank(r); };
  std::vector<int> malformed_ranks, differing;
  for (int r = 0; r < world_->size(); ++r) {
    const std::int32_t theirs = codes[static_cast<std::size_t>(r)];
    if (theirs >> 8 == static_cast<std::int32_t>(Request::malformed)) {
      malformed_ranks.push_back(world_rank(r));
    } else if (theirs != codes[0]) {
      differing.push_back(r);
    }
  }
  if (is_malformed) fail(Errc::invalid_argument, std::move(malformed) + "; no group is made");
  if (!malformed_ranks.empty()) {
    fail(Errc::invalid_argument,
         fmt::format("{} asked for a group of no axis or a malformed axis list (each says "
                     "which); no group is made",
                     ranks_text(malformed_ranks)));
  }
  if (!differing.empty()) {
    const bool mine_differs = codes[static_cast<std::size_t>(rank_)] != codes[0];
    const int shown = mine_differs ? rank_ : differing[0];
    std::string detail =
        fmt::format("rank {} asked for {} while rank {} asked for {}", world_rank(shown),
                    request_name(codes[static_cast<std::size_t>(shown)]), world_rank(0),
                    request_name(codes[0]));
    if (differing.size() > 1) {
      std::vector<int> named;
      for (int r : differing) named.push_back(world_rank(r));
      detail += fmt::format(" ({} differ from rank {})", ranks_text(named), world_rank(0));
    }
    fail(Errc::desync, std::move(detail) +
                           ": every rank must make the same groups in the same order; no group "
                           "is made");
  }

  // The color names the group among its kind; members keep their world order (key).
  int color = -1;
  switch (static_cast<Request>(code >> 8)) {
    case Request::axes:
      color = layout_.group_index(Axes::from_mask(static_cast<std::uint8_t>(code)), rank_);
      break;
    case Request::embedding:
      if (layout_.in_embedding_group(rank_)) color = layout_.group_index(Axis::pp, rank_);
      break;
    case Request::position_embedding:
      if (layout_.in_position_embedding_group(rank_)) color = layout_.group_index(Axis::pp, rank_);
      break;
    case Request::malformed:
      break;
  }
  auto group = co_await world_->split(color, rank_);
  groups_.emplace(code, group);
  co_return group;
}

}  // namespace braid::parallel
