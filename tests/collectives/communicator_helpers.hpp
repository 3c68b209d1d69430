// What the Communicator's tests share beside the all-reduce check (all_reduce_check.hpp):
// a selection table that forces algorithms, and the check that a bad setting stops the
// communicators being made on every rank (tests/support/rank_threads.hpp).
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/awaitable.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>

#include "../support/rank_threads.hpp"

namespace braid::collectives::testing {

// The built-in selection rules under `rules` (BRAID_ALGO syntax), to force an algorithm.
inline std::shared_ptr<const SelectionTable> forcing(std::string_view rules) {
  return std::make_shared<const SelectionTable>(SelectionTable::with_overrides(rules));
}

// Making the communicators on `ranks` ranks fails on every rank with invalid_environment,
// in a message that contains `naming`.
inline void expect_environment_error_on_every_rank(int ranks, std::string_view naming) {
  const auto failures =
      braid::testing::run_ranks_collecting(ranks, [](auto) -> asio::awaitable<void> { co_return; });
  for (const std::exception_ptr& failure : failures) {
    ASSERT_TRUE(failure) << "the communicator was made";
    try {
      std::rethrow_exception(failure);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_environment) << e.what();
      EXPECT_THAT(e.what(), ::testing::HasSubstr(std::string(naming)));
    }
  }
}

}  // namespace braid::collectives::testing
