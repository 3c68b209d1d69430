// Checks for the errors braid throws at a call, before any operation starts.
#pragma once

#include <string_view>

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

}  // namespace braid::testing
