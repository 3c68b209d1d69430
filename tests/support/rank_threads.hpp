// Ranks as threads for code that blocks (a training loop, the reducer's finalize): each
// thread is one rank with its own Runtime, World and world Communicator, and runs `body`
// on itself, not on its runtime. Returns each rank's error message, empty where it passed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <braid/collectives/communicator.hpp>
#include <braid/core/runtime.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/world.hpp>

namespace braid::testing {

// What a launcher would tell thread rank `rank` of `size`, with rank 0 serving the store on
// `port`. `node_of_rank` (empty: one node) places ranks on pretend nodes, as a launcher on
// several machines would, so hierarchical algorithms run on one machine.
inline transport::LaunchInfo thread_rank_launch(int rank, int size, std::uint16_t port,
                                                std::vector<int> node_of_rank = {}) {
  if (node_of_rank.empty()) node_of_rank.assign(static_cast<std::size_t>(size), 0);
  const int node = node_of_rank[static_cast<std::size_t>(rank)];
  const auto on_node = [&](int upto) {
    return static_cast<int>(std::count(node_of_rank.begin(), node_of_rank.begin() + upto, node));
  };
  return {.rank = rank,
          .world_size = size,
          .local_rank = on_node(rank),
          .local_world_size = on_node(size),
          .node_rank = node,
          .num_nodes = 1 + *std::max_element(node_of_rank.begin(), node_of_rank.end()),
          .store_host = "127.0.0.1",
          .store_port = port,
          .token = "",
          .source = "test"};
}

using BlockingRankBody = std::function<void(int rank, std::shared_ptr<collectives::Communicator>)>;

inline std::vector<std::string> run_blocking_ranks(int size, const BlockingRankBody& body) {
  const auto port = transport::find_free_port();
  std::vector<std::string> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      std::string& error = errors[static_cast<std::size_t>(r)];
      try {
        Runtime runtime({.rank = r});
        auto world = transport::World::join(runtime, thread_rank_launch(r, size, port));
        auto comm = collectives::Communicator::world(*world, {.timeout = std::chrono::seconds(20)});
        body(r, comm);
      } catch (const std::exception& e) {
        error = e.what();
        if (error.empty()) error = "?";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace braid::testing
