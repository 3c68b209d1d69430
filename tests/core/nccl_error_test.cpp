// NCCL's error strings are host-side: these run without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/nccl_error.hpp>

using ::testing::HasSubstr;

namespace braid {
namespace {

TEST(NcclError, CategoryNamesNcclAndUsesItsErrorStrings) {
  std::error_code code = make_nccl_error_code(ncclInvalidArgument);
  EXPECT_STREQ(code.category().name(), "nccl");
  EXPECT_EQ(code.message(), ncclGetErrorString(ncclInvalidArgument));
  EXPECT_NE(code.message(), make_nccl_error_code(ncclSystemError).message());
}

TEST(NcclError, CheckThrowsBraidErrorNamingTheCallAndPassesSuccessThrough) {
  EXPECT_NO_THROW(BRAID_NCCL_CHECK(ncclSuccess));
  try {
    BRAID_NCCL_CHECK(ncclInvalidUsage);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_nccl_error_code(ncclInvalidUsage));
    EXPECT_THAT(e.what(), HasSubstr("ncclInvalidUsage at "));
    EXPECT_THAT(e.what(), HasSubstr("nccl_error_test.cpp"));
    EXPECT_THAT(e.what(), HasSubstr("[nccl:"));
  }
}

TEST(NcclError, ANullArgumentIsRejectedOnTheHostAsABraidErrorNamingTheCall) {
  int version = 0;
  BRAID_NCCL_CHECK(ncclGetVersion(&version));
  EXPECT_GE(version, 22800);  // NCCL 2.28
  // A null unique-id pointer is rejected on the host, before any device is touched.
  try {
    BRAID_NCCL_CHECK(ncclGetUniqueId(nullptr));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code().category(), nccl_category());
    EXPECT_THAT(e.what(), HasSubstr("ncclGetUniqueId(nullptr)"));
  }
}

}  // namespace
}  // namespace braid
