// What a rank that leaves publishes about the work it issued: it travels through the store
// and comes back the same, and bytes that are not an encoding are refused before anything
// is allocated for them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/transport/issued_work.hpp>

namespace braid::transport {
namespace {

using ::testing::HasSubstr;

TEST(IssuedWork, RoundTripsThroughItsEncoding) {
  const IssuedWork work = {
      {.communicator = 1, .first_sequence = 0, .issued = 12, .point_to_point = {}},
      {.communicator = 4095,
       .first_sequence = std::uint64_t{1} << 40,
       .issued = (std::uint64_t{1} << 40) + 7,
       .point_to_point = {{.world_rank = 3, .sent = 5, .received = 0},
                          {.world_rank = 1048575, .sent = 0, .received = 9}}}};
  EXPECT_EQ(decode_issued_work(encode_issued_work(work)), work);
  EXPECT_EQ(decode_issued_work(encode_issued_work({})), IssuedWork{});
}

TEST(IssuedWork, TruncatedBytesAreAProtocolError) {
  const IssuedWork work = {{.communicator = 2,
                            .first_sequence = 0,
                            .issued = 3,
                            .point_to_point = {{.world_rank = 0, .sent = 1, .received = 1}}}};
  Bytes bytes = encode_issued_work(work);
  bytes.pop_back();
  try {
    decode_issued_work(bytes);
    FAIL() << "decoded a truncated encoding";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::protocol_error);
  }
}

TEST(IssuedWork, ACountLargerThanTheBytesCouldHoldIsRefusedBeforeAllocating) {
  const Bytes bytes = {0xff, 0xff, 0xff, 0xff};  // four billion communicators, no bytes
  try {
    decode_issued_work(bytes);
    FAIL() << "decoded an impossible count";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::protocol_error);
    EXPECT_THAT(e.what(), HasSubstr("4294967295 entries"));
  }
}

TEST(IssuedWork, TrailingBytesAreAProtocolError) {
  Bytes bytes = encode_issued_work({});
  bytes.push_back(0);
  EXPECT_THROW(decode_issued_work(bytes), Error);
}

}  // namespace
}  // namespace braid::transport
