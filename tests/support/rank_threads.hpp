// Ranks as threads for code that blocks (a training loop, the reducer's finalize): each
// thread is one rank with its own Runtime, World and world Communicator, and runs `body`
// on itself, not on its runtime. Returns each rank's error message, empty where it passed.
#pragma once

#include <chrono>
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
        transport::LaunchInfo launch{.rank = r,
                                     .world_size = size,
                                     .local_rank = r,
                                     .local_world_size = size,
                                     .store_host = "127.0.0.1",
                                     .store_port = port,
                                     .token = "",
                                     .source = "test"};
        auto world = transport::World::join(runtime, launch);
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
