// Ranks as threads: each thread is one rank with its own Runtime, World (UCX worker, store
// client; rank 0 serves the store) and world Communicator, the way a process would be.
// Bodies that block run on the rank's thread (run_blocking_ranks); coroutine bodies run on
// its runtime (run_ranks). `node_of_rank` (empty: one node) places ranks on pretend nodes,
// as a launcher on several machines would, so hierarchical algorithms run on one machine.
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

#include <boost/asio/awaitable.hpp>

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

// The one way tests make thread ranks: thread r joins a world of `size` as rank r (rank 0
// serving the store), makes the world Communicator with `options`, and runs `body` on
// itself with it. Returns each rank's exception, null where it passed.
using ThreadRankBody =
    std::function<void(int rank, Runtime&, std::shared_ptr<collectives::Communicator>)>;

inline std::vector<std::exception_ptr> for_each_thread_rank(
    int size, const ThreadRankBody& body, collectives::Communicator::Options options = {},
    std::vector<int> node_of_rank = {}) {
  const auto port = transport::find_free_port();
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        Runtime runtime({.rank = r});
        auto world =
            transport::World::join(runtime, thread_rank_launch(r, size, port, node_of_rank));
        auto comm = collectives::Communicator::world(*world, options);
        body(r, runtime, std::move(comm));
      } catch (...) {
        failures[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return failures;
}

// Ranks whose body blocks (a training loop, the reducer's finalize), on their own threads,
// not on their runtimes, on pretend nodes where `node_of_rank` says; the world Communicator
// times out after 20 s. Returns each rank's error message, empty where it passed.
using BlockingRankBody = std::function<void(int rank, std::shared_ptr<collectives::Communicator>)>;

inline std::vector<std::string> run_blocking_ranks(int size, const BlockingRankBody& body,
                                                   std::vector<int> node_of_rank = {}) {
  const auto failures = for_each_thread_rank(
      size,
      [&](int rank, Runtime&, std::shared_ptr<collectives::Communicator> comm) {
        body(rank, std::move(comm));
      },
      {.timeout = std::chrono::seconds(20)}, std::move(node_of_rank));
  std::vector<std::string> errors;
  for (const auto& failure : failures) {
    std::string& error = errors.emplace_back();
    if (!failure) continue;
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
    }
    if (error.empty()) error = "?";
  }
  return errors;
}

// Ranks whose body is a coroutine, run on each rank's runtime. Returns each rank's
// exception, null where it passed.
using RankBody = std::function<asio::awaitable<void>(std::shared_ptr<collectives::Communicator>)>;

inline std::vector<std::exception_ptr> run_ranks_collecting(
    int size, const RankBody& body, collectives::Communicator::Options options = {},
    std::vector<int> node_of_rank = {}) {
  return for_each_thread_rank(
      size,
      [&](int, Runtime& runtime, std::shared_ptr<collectives::Communicator> comm) {
        runtime.spawn(body(std::move(comm))).get();
      },
      std::move(options), std::move(node_of_rank));
}

// As run_ranks_collecting, rethrowing the first rank's failure.
inline void run_ranks(int size, const RankBody& body,
                      collectives::Communicator::Options options = {},
                      std::vector<int> node_of_rank = {}) {
  for (const auto& failure :
       run_ranks_collecting(size, body, std::move(options), std::move(node_of_rank))) {
    if (failure) std::rethrow_exception(failure);
  }
}

}  // namespace braid::testing
