// The ZeRO paper's model-state formulas, exactly: its own example (7.5B parameters on 64
// ranks in mixed precision with Adam), the four strategies in f32 with Adam and SGD, shards
// rounded up to whole elements, the transient unit, and bad shapes refused.
#include <gtest/gtest.h>

#include <braid/dp/model_state_memory.hpp>

#include "../support/expect_error.hpp"

namespace braid::dp {
namespace {

TEST(ModelStateMemory, ReproducesTheZeroPapersFigure1) {
  // Ψ = 7.5B, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB and 1.9 GB per device.
  const ModelStateShape shape{.parameters = 7'500'000'000,
                              .ranks = 64,
                              .parameter_bytes = 2,
                              .gradient_bytes = 2,
                              .optimizer_state_bytes = kMixedPrecisionAdamBytes};
  EXPECT_EQ(estimate_model_state_memory(shape, ShardedState::none).total(), 120'000'000'000);
  EXPECT_EQ(estimate_model_state_memory(shape, ShardedState::optimizer).total(), 31'406'250'000);
  EXPECT_EQ(estimate_model_state_memory(shape, ShardedState::gradients).total(), 16'640'625'000);
  EXPECT_EQ(estimate_model_state_memory(shape, ShardedState::parameters).total(), 1'875'000'000);
}

TEST(ModelStateMemory, ShardsEachPartInTurnForF32Adam) {
  // Ψ = 1000 on 4 ranks, 4-byte parameters and gradients, Adam's 8 bytes.
  const ModelStateShape shape{.parameters = 1000, .ranks = 4};
  const auto none = estimate_model_state_memory(shape, ShardedState::none);
  EXPECT_EQ(none.parameters, 4000);
  EXPECT_EQ(none.gradients, 4000);
  EXPECT_EQ(none.optimizer_state, 8000);
  EXPECT_EQ(none.total(), 16000);
  const auto zero1 = estimate_model_state_memory(shape, ShardedState::optimizer);
  EXPECT_EQ(zero1.parameters, 4000);
  EXPECT_EQ(zero1.gradients, 4000);
  EXPECT_EQ(zero1.optimizer_state, 2000);
  const auto zero2 = estimate_model_state_memory(shape, ShardedState::gradients);
  EXPECT_EQ(zero2.parameters, 4000);
  EXPECT_EQ(zero2.gradients, 1000);
  EXPECT_EQ(zero2.optimizer_state, 2000);
  const auto zero3 = estimate_model_state_memory(shape, ShardedState::parameters);
  EXPECT_EQ(zero3.parameters, 1000);
  EXPECT_EQ(zero3.gradients, 1000);
  EXPECT_EQ(zero3.optimizer_state, 2000);
  EXPECT_EQ(zero3.total(), none.total() / 4);  // ZeRO-3: exactly 1/N_d of DDP's
}

TEST(ModelStateMemory, StatelessSgdShardsNothingUnderZero1) {
  const ModelStateShape sgd{
      .parameters = 1000, .ranks = 4, .optimizer_state_bytes = kPlainSgdStateBytes};
  EXPECT_EQ(estimate_model_state_memory(sgd, ShardedState::optimizer).total(),
            estimate_model_state_memory(sgd, ShardedState::none).total());
  const ModelStateShape momentum{
      .parameters = 1000, .ranks = 4, .optimizer_state_bytes = kSgdMomentumStateBytes};
  EXPECT_EQ(estimate_model_state_memory(momentum, ShardedState::optimizer).optimizer_state, 1000);
}

TEST(ModelStateMemory, RoundsAShardUpToWholeElements) {
  // 10 elements on 3 ranks: each holds 4 (the last one's padded).
  const ModelStateShape shape{.parameters = 10, .ranks = 3};
  const auto zero3 = estimate_model_state_memory(shape, ShardedState::parameters);
  EXPECT_EQ(zero3.parameters, 16);
  EXPECT_EQ(zero3.gradients, 16);
  EXPECT_EQ(zero3.optimizer_state, 32);
}

TEST(ModelStateMemory, AddsTheLargestUnitWhereItIsGatheredOrReduced) {
  const ModelStateShape shape{.parameters = 1000, .ranks = 4, .largest_unit = 300};
  EXPECT_EQ(estimate_model_state_memory(shape, ShardedState::none).transient, 0);
  EXPECT_EQ(estimate_model_state_memory(shape, ShardedState::optimizer).transient, 0);
  // ZeRO-2: the unit's whole gradients until its reduce-scatter.
  EXPECT_EQ(estimate_model_state_memory(shape, ShardedState::gradients).transient, 1200);
  // ZeRO-3: its whole parameters too.
  const auto zero3 = estimate_model_state_memory(shape, ShardedState::parameters);
  EXPECT_EQ(zero3.transient, 2400);
  EXPECT_EQ(zero3.peak(), zero3.total() + 2400);
}

TEST(ModelStateMemory, RefusesShapesThatCannotBe) {
  braid::testing::expect_invalid_argument(
      [] { estimate_model_state_memory({.parameters = 10, .ranks = 0}, ShardedState::none); },
      "ranks at least 1");
  braid::testing::expect_invalid_argument(
      [] { estimate_model_state_memory({.parameters = -1}, ShardedState::none); },
      "must not be negative");
  braid::testing::expect_invalid_argument(
      [] {
        estimate_model_state_memory({.parameters = 10, .largest_unit = 11},
                                    ShardedState::parameters);
      },
      "the unit at most the parameters");
}

}  // namespace
}  // namespace braid::dp
