// Communicator::split (communicator.hpp): an all-gather of every rank's (color, key) and a
// broadcast of the new communicators' names, which rank 0 takes from the World's store
// (communicator_ids.hpp), at the two sequence numbers split reserved when it was called.
// Communicator::subgroup: the same name, drawn by the first member and passed through the
// store, with no collective on the parent.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>
#include <braid/transport/ucx/tag.hpp>
#include <braid/transport/world.hpp>

#include "collectives/communicator_ids.hpp"
#include "collectives/communicator_state.hpp"

namespace braid::collectives {

asio::awaitable<std::shared_ptr<Communicator>> Communicator::split(int color, int key) {
  // Two collectives on this communicator (an all-gather of (color, key) and a broadcast
  // of the new ids), numbered now so that split keeps its place in the order.
  const std::uint64_t sequence = state_->next_sequence_.fetch_add(2);
  std::shared_ptr<Communicator> self = shared_from_this();
  return state_->run_split(std::move(self), sequence, color, key, deadline_after(state_->timeout_));
}

asio::awaitable<std::shared_ptr<Communicator>> Communicator::State::run_split(
    std::shared_ptr<Communicator> self, std::uint64_t sequence, int color, int key,
    Deadline deadline) {
  // Ids that communicators destroyed here gave back: counted before the all-gather, so
  // rank 0 below sees those of every rank taking part.
  co_await detail::publish_releases(world_.store(), ids_->take_released(), world_.rank());
  const auto world_size = static_cast<std::size_t>(size());
  std::vector<std::int32_t> mine{color, key};
  std::vector<std::int32_t> everyone(2 * world_size);
  co_await run_step(self, CollectiveKind::all_gather, Buffer(mine), Buffer(everyone), sequence,
                    deadline);
  std::vector<int> colors;
  for (std::size_t r = 0; r < world_size; ++r) {
    if (everyone[2 * r] >= 0) colors.push_back(everyone[2 * r]);
  }
  std::sort(colors.begin(), colors.end());
  colors.erase(std::unique(colors.begin(), colors.end()), colors.end());

  // Per color (serial, id, first sequence), and one word so that it is never empty.
  std::vector<std::int64_t> names(3 * colors.size() + 1);
  if (rank_ == 0) {
    const std::vector<detail::CommunicatorName> made =
        co_await detail::allocate_names(world_.store(), colors.size(), world_.rank());
    for (std::size_t i = 0; i < made.size(); ++i) {
      names[3 * i] = made[i].serial;
      names[3 * i + 1] = made[i].id;
      names[3 * i + 2] = static_cast<std::int64_t>(made[i].first_sequence);
    }
  }
  co_await run_step(self, CollectiveKind::broadcast, Buffer(names), Buffer(names), sequence + 1,
                    deadline);
  if (color < 0) co_return nullptr;

  const auto color_index = static_cast<std::size_t>(
      std::lower_bound(colors.begin(), colors.end(), color) - colors.begin());
  const std::int64_t id = names[3 * color_index + 1];
  if (id >= static_cast<std::int64_t>(transport::max_communicators)) {
    throw Error(Errc::invalid_argument,
                fmt::format("all {} ids the message tag has for split communicators are "
                            "taken (an id comes back once every member has destroyed its "
                            "communicator and split again)",
                            transport::max_communicators - detail::kFirstSplitId),
                {.rank = world_rank(rank_), .operation = "split"});
  }
  std::vector<std::pair<int, int>> members;  // (key, rank here)
  for (std::size_t r = 0; r < world_size; ++r) {
    if (everyone[2 * r] == color) members.emplace_back(everyone[2 * r + 1], static_cast<int>(r));
  }
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (const auto& [member_key, r] : members) ranks.push_back(world_rank(r));
  Options options{.timeout = timeout_,
                  .check_fingerprints = check_fingerprints_,
                  .selection = selection_,
                  .cuda_stream = cuda_stream_};
  detail::CommunicatorIdentity name{
      .id = static_cast<std::uint32_t>(id),
      .serial = names[3 * color_index],
      .first_sequence = static_cast<std::uint64_t>(names[3 * color_index + 2]),
      .ids = ids_};
  auto made = std::make_shared<Communicator>(Private{}, world_, std::move(ranks), std::move(name),
                                             std::move(options));
  made->state_->staging_engine_ = staging_engine_;  // staging_engine_override.hpp
  co_return made;
}

asio::awaitable<std::shared_ptr<Communicator>> Communicator::subgroup(
    std::vector<int> world_ranks, std::string key, std::optional<Clock::duration> timeout) {
  std::shared_ptr<Communicator> self = shared_from_this();  // alive until this returns
  const int me = state_->world_.rank();
  auto refuse = [&](std::string what) {
    return Error(Errc::invalid_argument, std::move(what), {.rank = me, .operation = "subgroup"});
  };
  std::vector<int> sorted = world_ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || sorted.front() < 0 || sorted.back() >= state_->world_.size() ||
      std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
      !std::binary_search(sorted.begin(), sorted.end(), me)) {
    throw refuse(
        fmt::format("the ranks [{}] must be distinct World ranks below {}, this rank "
                    "({}) among them",
                    fmt::join(world_ranks, ", "), state_->world_.size(), me));
  }
  const std::string members = fmt::format("{}", fmt::join(world_ranks, ","));
  key = key.empty()
            ? fmt::format("braid/subgroup/{}/{}", members, state_->ids_->next_subgroup(members))
            : "braid/subgroup/" + key;
  co_await detail::publish_releases(state_->world_.store(), state_->ids_->take_released(), me);
  std::vector<std::int64_t> name(3);
  if (me == world_ranks.front()) {
    const detail::CommunicatorName made =
        (co_await detail::allocate_names(state_->world_.store(), 1, me)).front();
    name = {made.serial, made.id, static_cast<std::int64_t>(made.first_sequence)};
    transport::Bytes bytes(sizeof(std::int64_t) * name.size());
    std::memcpy(bytes.data(), name.data(), bytes.size());
    // A group of one has no one to read it.
    if (world_ranks.size() > 1) co_await state_->world_.store().set(key, std::move(bytes));
  } else {
    // The first member hands the name out: if it fails or leaves first, this fails now.
    const transport::Bytes bytes = co_await state_->world_.get_from(
        world_ranks.front(), key, deadline_after(timeout.value_or(state_->timeout_)));
    if (bytes.size() != sizeof(std::int64_t) * name.size()) {
      throw refuse(fmt::format("the store's {} holds {} bytes, not a communicator's name", key,
                               bytes.size()));
    }
    std::memcpy(name.data(), bytes.data(), bytes.size());
    // The last member to read the name erases it.
    if (co_await state_->world_.store().add(key + "/read", 1) ==
        static_cast<std::int64_t>(world_ranks.size()) - 1) {
      co_await state_->world_.store().erase(key);
      co_await state_->world_.store().erase(key + "/read");
    }
  }
  if (name[1] >= static_cast<std::int64_t>(transport::max_communicators)) {
    throw refuse(fmt::format("all {} ids the message tag has for split communicators are taken",
                             transport::max_communicators - detail::kFirstSplitId));
  }
  Options options{.timeout = timeout.value_or(state_->timeout_),
                  .check_fingerprints = state_->check_fingerprints_,
                  .selection = state_->selection_,
                  .cuda_stream = state_->cuda_stream_};
  detail::CommunicatorIdentity made_name{.id = static_cast<std::uint32_t>(name[1]),
                                         .serial = name[0],
                                         .first_sequence = static_cast<std::uint64_t>(name[2]),
                                         .ids = state_->ids_};
  auto made = std::make_shared<Communicator>(Private{}, state_->world_, std::move(world_ranks),
                                             std::move(made_name), std::move(options));
  made->state_->staging_engine_ = state_->staging_engine_;
  co_return made;
}

}  // namespace braid::collectives
