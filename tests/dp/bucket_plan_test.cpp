// Bucket assignment: reverse order, one kind per bucket, the first bucket's smaller limit,
// parameters never split, numbering by expected readiness.
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/dp/bucket_plan.hpp>

namespace braid::dp {
namespace {

ParameterSpec f32(std::size_t count) {
  return ParameterSpec{.name = "p", .count = count, .dtype = DType::f32};
}

TEST(BucketPlan, FillsInReverseOrderWithASmallFirstBucketAndNeverSplitsAParameter) {
  // 4-byte elements: limits of 16 and 40 bytes are 4 and 10 elements.
  const std::vector<ParameterSpec> params{f32(3), f32(3), f32(6), f32(2), f32(5)};
  const auto buckets = plan_buckets(params, reverse_order(params.size()), {16, 40});
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].parameters, (std::vector<std::size_t>{4}));  // 5 elements >= 4: closed
  EXPECT_EQ(buckets[0].count, 5u);
  EXPECT_EQ(buckets[1].parameters, (std::vector<std::size_t>{3, 2, 1}));  // 2+6+3 = 11 >= 10
  EXPECT_EQ(buckets[1].offsets, (std::vector<std::size_t>{0, 2, 8}));
  EXPECT_EQ(buckets[1].count, 11u);
  EXPECT_EQ(buckets[2].parameters, (std::vector<std::size_t>{0}));  // what is left
  const auto all = plan_buckets(params, reverse_order(params.size()), {16, 1000});
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].parameters, (std::vector<std::size_t>{3, 2, 1, 0}));
}

TEST(BucketPlan, KeepsDtypesApartAndNumbersBucketsByTheirFirstParameter) {
  std::vector<ParameterSpec> params{f32(4), f32(4), f32(4)};
  params[1].dtype = DType::f64;
  const auto buckets = plan_buckets(params, reverse_order(3), {1 << 20, 1 << 20});
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].parameters, (std::vector<std::size_t>{2, 0}));  // f32, first seen first
  EXPECT_EQ(buckets[0].dtype, DType::f32);
  EXPECT_EQ(buckets[1].parameters, (std::vector<std::size_t>{1}));
  EXPECT_EQ(buckets[1].dtype, DType::f64);
}

TEST(BucketPlan, FollowsAGivenReadyOrder) {
  const std::vector<ParameterSpec> params{f32(4), f32(4), f32(4)};
  const std::vector<std::size_t> order{1, 0, 2};
  const auto buckets = plan_buckets(params, order, {16, 16});
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].parameters[0], 1u);
  EXPECT_EQ(buckets[1].parameters[0], 0u);
  EXPECT_EQ(buckets[2].parameters[0], 2u);
}

TEST(BucketPlan, RefusesAnOrderThatIsNotAPermutation) {
  const std::vector<ParameterSpec> params{f32(1), f32(1)};
  const std::vector<std::size_t> twice{1, 1};
  EXPECT_THROW(plan_buckets(params, twice, {}), Error);
  const std::vector<std::size_t> short_order{1};
  EXPECT_THROW(plan_buckets(params, short_order, {}), Error);
  EXPECT_THROW(plan_buckets(params, reverse_order(2), {0, 16}), Error);
}

}  // namespace
}  // namespace braid::dp
