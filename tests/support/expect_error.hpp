// Checks for the errors braid throws at a call, before any operation starts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>

namespace braid::testing {

// `call` throws braid::Error(Errc::invalid_argument) whose message contains `needle`.
template <class Call>
void expect_invalid_argument(Call call, std::string_view needle) {
  try {
    call();
    ADD_FAILURE() << "no error for " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    EXPECT_THAT(e.what(), ::testing::HasSubstr(needle));
  }
}

// Every rank of run_blocking_ranks passed: each error message empty, or named by its rank.
inline void expect_all_passed(const std::vector<std::string>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace braid::testing
