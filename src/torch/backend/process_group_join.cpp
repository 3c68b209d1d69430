// ProcessGroup::join (process_group.hpp): the ranks meet in the PyTorch store they are
// handed. Where every member already holds one World (a new_group under a braid default
// group) they make a subgroup of it. Otherwise they learn which of them share a host, rank
// 0 publishes where it will serve braid's store, and every rank joins a braid World there.
// Cost: one set and P gets on the PyTorch store per rank, then Communicator::subgroup (a
// few store round trips) or World::join.
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <braid/torch/backend/process_group.hpp>
#include <braid/transport/bootstrap.hpp>

namespace braid::torch {

namespace {

constexpr const char* kStoreKey = "braid/store";
constexpr const char* kSubgroupKey = "braid/subgroup";
constexpr const char* kSubgroupReaders = "braid/subgroup/readers";

std::string parent_key(int rank) {
  return fmt::format("braid/parent/{}", rank);
}

// The World this process joined for its braid groups, while a group uses it, and every
// World joined (announce_failure reaches them all).
std::mutex joined_mutex;
std::weak_ptr<ProcessGroup::JoinedWorld> joined_world;
std::vector<std::weak_ptr<ProcessGroup::JoinedWorld>> every_joined_world;

std::string host_key(int rank) {
  return fmt::format("braid/host/{}", rank);
}

std::string this_host() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

void set(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
}

std::string get(c10d::Store& store, const std::string& key) {
  const std::vector<std::uint8_t> value = store.get(key);
  return std::string(value.begin(), value.end());
}

// 128 random bits in hex: the token braid's store asks of its clients, so a stranger that
// finds the port cannot join.
std::string random_token() {
  std::random_device device;
  std::string token;
  for (int i = 0; i < 4; ++i) token += fmt::format("{:08x}", device());
  return token;
}

// This rank's place among the nodes: ranks on one host form a node, numbered in order of
// their first rank.
void place_on_nodes(transport::LaunchInfo& info, const std::vector<std::string>& hosts) {
  std::map<std::string, int> node_of_host;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    const auto [it, added] = node_of_host.emplace(hosts[r], static_cast<int>(node_of_host.size()));
    if (hosts[r] != hosts[info.rank]) continue;
    if (r < info.rank) ++info.local_rank;
    ++info.local_world_size;
    info.node_rank = it->second;
  }
  info.num_nodes = static_cast<int>(node_of_host.size());
}

}  // namespace

c10::intrusive_ptr<ProcessGroup> ProcessGroup::join(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  TORCH_CHECK(store, "braid rank ", rank, ": join: needs a store");
  TORCH_CHECK(size > 0 && rank >= 0 && rank < size, "braid rank ", rank,
              ": join: rank must be in [0, ", size, ")");
  try {
    // A group whose members all share one World this process joined already (new_group
    // under a braid default group) is a subgroup of it: no new World, connections or
    // thread. Each member says which World it holds and its rank there.
    std::shared_ptr<JoinedWorld> parent;
    {
      std::lock_guard lock(joined_mutex);
      parent = joined_world.lock();
    }
    set(*store, parent_key(rank),
        parent ? fmt::format("{} {}", parent->world->rank(), parent->identity) : "-");
    std::vector<int> world_ranks;
    for (int r = 0; r < size && parent; ++r) {
      const std::string said = get(*store, parent_key(r));
      const std::size_t space = said.find(' ');
      if (space == std::string::npos || said.substr(space + 1) != parent->identity) {
        world_ranks.clear();
        break;
      }
      world_ranks.push_back(std::stoi(said.substr(0, space)));
    }
    if (static_cast<int>(world_ranks.size()) == size) {
      // The subgroup's key in braid's store: drawn by the group's rank 0 and passed through
      // the group's own PyTorch store, so no two groups share one.
      std::string key = "alone";  // a group of one publishes no name
      if (size > 1 && rank == 0) {
        // Rank 0 keeps what it drew: reading it back could come after the last reader
        // deleted it, and wait for a key that no longer exists until the timeout.
        key = random_token();
        set(*store, kSubgroupKey, key);
      } else if (size > 1) {
        key = get(*store, kSubgroupKey);
        // The last to read it deletes it, so a group name PyTorch uses again finds none
        // stale.
        if (store->add(kSubgroupReaders, 1) == size - 1) {
          store->deleteKey(kSubgroupKey);
          store->deleteKey(kSubgroupReaders);
        }
      }
      // The group's own timeout, as new_group was given it.
      auto communicator =
          parent->communicator
              ->launch(parent->communicator->subgroup(
                  world_ranks, key, std::chrono::duration_cast<Clock::duration>(timeout)))
              .get();
      return c10::make_intrusive<ProcessGroup>(rank, size, std::move(parent),
                                               std::move(communicator));
    }
    // Every member read the same answers, so every member takes the same path.

    transport::LaunchInfo info;
    info.rank = rank;
    info.world_size = size;
    info.local_world_size = 0;
    info.source = "torch.distributed";
    set(*store, host_key(rank), this_host());
    std::vector<std::string> hosts;
    for (int r = 0; r < size; ++r) hosts.push_back(get(*store, host_key(r)));
    place_on_nodes(info, hosts);

    if (rank == 0) {
      const char* master = std::getenv("MASTER_ADDR");
      info.store_host = master != nullptr && *master != '\0' ? master
                        : info.num_nodes == 1                ? "127.0.0.1"
                                                             : hosts[0];
      info.store_port = size == 1 ? 0 : transport::find_free_port();
      info.token = random_token();
      set(*store, kStoreKey,
          transport::format_host_port(info.store_host, info.store_port) + " " + info.token);
    } else {
      const std::string published = get(*store, kStoreKey);
      const std::size_t space = published.find(' ');
      const transport::HostPort address =
          transport::parse_host_port(published.substr(0, space), kStoreKey);
      info.store_host = address.host;
      info.store_port = address.port;
      info.token = space == std::string::npos ? "" : published.substr(space + 1);
    }

    auto joined = std::make_shared<JoinedWorld>();
    joined->identity =
        transport::format_host_port(info.store_host, info.store_port) + " " + info.token;
    joined->runtime = std::make_unique<Runtime>(Runtime::Options{.rank = rank});
    transport::World::Options world_options;
    world_options.join_timeout = timeout;
    joined->world = transport::World::join(*joined->runtime, info, world_options);
    collectives::Communicator::Options options;
    options.timeout = timeout;
    joined->communicator = collectives::Communicator::world(*joined->world, options);
    {
      std::lock_guard lock(joined_mutex);
      if (joined_world.expired()) joined_world = joined;
      std::erase_if(every_joined_world, [](const auto& w) { return w.expired(); });
      every_joined_world.push_back(joined);
    }
    auto communicator = joined->communicator;
    return c10::make_intrusive<ProcessGroup>(rank, size, std::move(joined),
                                             std::move(communicator));
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "braid rank ", rank, ": join: ", e.what());
  }
}

void announce_failure(const std::string& why) {
  std::vector<std::shared_ptr<ProcessGroup::JoinedWorld>> worlds;
  {
    std::lock_guard lock(joined_mutex);
    for (const auto& weak : every_joined_world) {
      if (auto joined = weak.lock()) worlds.push_back(std::move(joined));
    }
  }
  for (const auto& joined : worlds) {
    if (joined->world) joined->world->announce_failure(why);
  }
}

}  // namespace braid::torch
