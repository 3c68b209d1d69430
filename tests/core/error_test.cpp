#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>

using ::testing::HasSubstr;

namespace braid {
namespace {

TEST(Error, MessageNamesRankOperationPeerAndSequence) {
  Error e(Errc::peer_failed, "connection reset",
          {.rank = 0, .peer = 3, .operation = "recv", .sequence = 7});
  EXPECT_STREQ(e.what(), "rank 0: recv (peer rank 3, seq 7): peer failed: connection reset");
  EXPECT_EQ(e.code(), Errc::peer_failed);
  EXPECT_EQ(e.context().peer, 3);
  EXPECT_EQ(e.detail(), "connection reset");
}

TEST(Error, MessageOmitsContextThatWasNotGiven) {
  Error e(Errc::timeout, "no reply within 2s");
  EXPECT_STREQ(e.what(), "timed out: no reply within 2s");
}

TEST(Error, ForeignCategoriesShowTheirNameAndValue) {
  Error e(std::make_error_code(std::errc::connection_refused), "store at 127.0.0.1:1",
          {.rank = 2, .operation = "store.connect"});
  EXPECT_THAT(e.what(), HasSubstr("rank 2: store.connect: "));
  EXPECT_THAT(e.what(), HasSubstr("[generic:"));
}

TEST(Error, BraidErrcComparesAsAnErrorCode) {
  std::error_code code = Errc::timeout;
  EXPECT_EQ(code.category().name(), std::string("braid"));
  EXPECT_EQ(code.message(), "timed out");
}

TEST(Enforce, ThrowsInvariantErrorWithConditionFileAndMessage) {
  try {
    int world = 3;
    BRAID_ENFORCE(world % 2 == 0, "world {} is odd", world);
    FAIL() << "BRAID_ENFORCE did not throw";
  } catch (const InvariantError& e) {
    EXPECT_THAT(e.what(), HasSubstr("error_test.cpp"));
    EXPECT_THAT(e.what(), HasSubstr("'world % 2 == 0'"));
    EXPECT_THAT(e.what(), HasSubstr("world 3 is odd"));
  }
}

TEST(Enforce, DoesNothingWhenTheConditionHolds) {
  EXPECT_NO_THROW(BRAID_ENFORCE(1 + 1 == 2, "math"));
}

}  // namespace
}  // namespace braid
