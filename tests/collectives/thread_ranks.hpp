// Ranks as threads: each thread is one rank with its own Runtime, World (UCX worker,
// store client; rank 0 serves the store) and world Communicator, the way a process would
// be. `body` runs on each rank's runtime; the first failure of any rank is rethrown.
// `node_of_rank` (empty: one node) places ranks on pretend nodes, as a launcher on several
// machines would, so hierarchical algorithms run on one machine.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include <braid/collectives/communicator.hpp>
#include <braid/core/runtime.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/world.hpp>

#include "../support/rank_threads.hpp"

namespace braid::collectives::testing {

using RankBody = std::function<asio::awaitable<void>(std::shared_ptr<Communicator>)>;

struct RankFailures {
  std::mutex mutex;
  std::vector<std::exception_ptr> by_rank;
};

// Runs `body` on `size` thread ranks; returns each rank's exception (null if it passed).
inline std::vector<std::exception_ptr> run_ranks_collecting(int size, const RankBody& body,
                                                            Communicator::Options options = {},
                                                            std::vector<int> node_of_rank = {}) {
  const auto port = transport::find_free_port();
  RankFailures failures;
  failures.by_rank.resize(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        Runtime runtime({.rank = r});
        auto world = transport::World::join(
            runtime, braid::testing::thread_rank_launch(r, size, port, node_of_rank));
        auto comm = Communicator::world(*world, options);
        try {
          runtime.spawn(body(comm)).get();
        } catch (...) {
          std::lock_guard lock(failures.mutex);
          failures.by_rank[static_cast<std::size_t>(r)] = std::current_exception();
        }
      } catch (...) {
        std::lock_guard lock(failures.mutex);
        if (!failures.by_rank[static_cast<std::size_t>(r)]) {
          failures.by_rank[static_cast<std::size_t>(r)] = std::current_exception();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return failures.by_rank;
}

// As run_ranks_collecting, rethrowing the first rank's failure.
inline void run_ranks(int size, const RankBody& body, Communicator::Options options = {},
                      std::vector<int> node_of_rank = {}) {
  for (const auto& failure :
       run_ranks_collecting(size, body, std::move(options), std::move(node_of_rank))) {
    if (failure) std::rethrow_exception(failure);
  }
}

}  // namespace braid::collectives::testing
