// The framework-agnostic reducer with gradients in plain vectors, ranks as threads:
// averaging across buckets, the comm hooks' error bounds, and gradient clipping.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <braid/collectives/reduce_kernels.hpp>
#include <braid/core/error.hpp>
#include <braid/dp/comm_hook.hpp>
#include <braid/dp/reducer.hpp>
#include <braid/trace/recorder.hpp>

#include "../support/rank_threads.hpp"
#include "../support/reduce_spans.hpp"
#include "../support/scoped_env.hpp"

namespace braid::dp {
namespace {

using collectives::Communicator;

class VectorGradients final : public GradientAccess {
 public:
  explicit VectorGradients(const std::vector<ParameterSpec>& specs) {
    for (const auto& spec : specs) values.emplace_back(spec.count, 0.0f);
  }
  std::optional<Buffer> gradient(std::size_t index, bool) override { return Buffer(values[index]); }
  std::vector<std::vector<float>> values;
};

// A 6 x 5 matrix, a 5-vector and a 4 x 3 matrix.
std::vector<ParameterSpec> model() {
  return {ParameterSpec{.name = "w1", .count = 30, .shape = {6, 5}},
          ParameterSpec{.name = "b1", .count = 5, .shape = {5}},
          ParameterSpec{.name = "w2", .count = 12, .shape = {4, 3}}};
}

// Rank r's gradient of parameter p at step s: reproducible, different per rank.
float gradient_value(int rank, std::size_t p, std::size_t i, int step) {
  return std::sin(static_cast<float>(1 + rank * 7 + static_cast<int>(p) * 13 +
                                     static_cast<int>(i) * 3 + step * 17));
}

void backward(Reducer& reducer, VectorGradients& grads, int rank, int step) {
  reducer.prepare_for_backward();
  for (std::size_t p = grads.values.size(); p-- > 0;) {
    for (std::size_t i = 0; i < grads.values[p].size(); ++i)
      grads.values[p][i] = gradient_value(rank, p, i, step);
    reducer.mark_ready(p);
  }
  reducer.finalize();
}

float exact_average(int world, std::size_t p, std::size_t i, int step) {
  float sum = 0;
  for (int r = 0; r < world; ++r) sum += gradient_value(r, p, i, step);
  return sum / static_cast<float>(world);
}

void expect_passed(const std::vector<std::string>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// One byte of limit: every parameter is a bucket of its own. A rebuild (after the first
// iteration) resets hooks' per-bucket state, so error-feedback bounds are tested without.
Reducer::Options one_per_bucket(bool rebuild = true) {
  return {.limits = {.first_bucket_bytes = 1, .bucket_cap_bytes = 1}, .rebuild_buckets = rebuild};
}

TEST(Reducer, AveragesEveryBucketAcrossRanks) {
  for (const int world : {2, 3}) {
    expect_passed(
        testing::run_blocking_ranks(world, [&](int rank, std::shared_ptr<Communicator> comm) {
          VectorGradients grads(model());
          Reducer reducer(comm, model(), grads, one_per_bucket());
          EXPECT_EQ(reducer.bucket_count(), 3u);
          for (int step = 0; step < 3; ++step) {
            backward(reducer, grads, rank, step);
            for (std::size_t p = 0; p < grads.values.size(); ++p) {
              for (std::size_t i = 0; i < grads.values[p].size(); ++i) {
                ASSERT_NEAR(grads.values[p][i], exact_average(world, p, i, step), 1e-6);
              }
            }
          }
        }));
  }
}

// With cross-memory attach off, a bucket's all-reduce reads peers' buckets directly only
// through memory the ranks share: its single-copy phase ("shared_memory.reduce") shows it,
// where private buckets copy every chunk through the arena ("shared_memory.chunk").
TEST(Reducer, KeepsItsBucketsInMemoryTheRanksShareUnlessToldNot) {
  const braid::testing::ScopedEnv no_cross_memory("BRAID_SHM_SINGLE_COPY", "0");
  const braid::testing::ScopedEnv every_step("BRAID_TRACE_STEPS_KIB", "0");
  // Buckets above the arena's 16 KiB inline slots.
  const std::vector<ParameterSpec> large = {
      ParameterSpec{.name = "w", .count = 20000, .shape = {20000}},
      ParameterSpec{.name = "b", .count = 7001, .shape = {7001}}};
  for (const bool shared : {true, false}) {
    trace::clear();
    trace::set_enabled(true);
    expect_passed(testing::run_blocking_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
      VectorGradients grads(large);
      Reducer reducer(comm, large, grads, {.shared_buckets = shared});
      for (int step = 0; step < 2; ++step) {
        backward(reducer, grads, rank, step);
        for (std::size_t p = 0; p < grads.values.size(); ++p) {
          for (std::size_t i = 0; i < grads.values[p].size(); ++i) {
            ASSERT_NEAR(grads.values[p][i], exact_average(2, p, i, step), 1e-6);
          }
        }
      }
    }));
    trace::set_enabled(false);
    std::set<std::string> phases;
    for (const trace::Record& record : trace::snapshot().records) phases.insert(record.name);
    EXPECT_EQ(phases.contains("shared_memory.reduce"), shared) << "shared buckets " << shared;
    EXPECT_EQ(phases.contains("shared_memory.chunk"), !shared) << "shared buckets " << shared;
  }
}

// Between prepare_for_backward and finalize a rank says it computes
// (Communicator::set_computing): a bucket's all-reduce that starts while it is still in
// backward and its partner is already waiting in finalize is reduced by the partner alone.
TEST(Reducer, ARankStillInBackwardLeavesItsBucketsReductionToARankThatFinished) {
  const braid::testing::ScopedEnv every_step("BRAID_TRACE_STEPS_KIB", "0");
  const braid::testing::ScopedEnv every_op("BRAID_TRACE_SAMPLE_KIB", "0");
  // Two buckets of 160 KiB, past the inline slots: each a single-copy all-reduce.
  const std::vector<ParameterSpec> large = {
      ParameterSpec{.name = "a", .count = 40000, .shape = {40000}},
      ParameterSpec{.name = "b", .count = 40000, .shape = {40000}}};
  std::atomic<bool> rank0_finishing{false};
  trace::clear();
  trace::set_enabled(true);
  expect_passed(testing::run_blocking_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    VectorGradients grads(large);
    Reducer reducer(comm, large, grads, one_per_bucket(/*rebuild=*/false));
    reducer.prepare_for_backward();
    auto fill = [&](std::size_t p) {
      for (std::size_t i = 0; i < grads.values[p].size(); ++i)
        grads.values[p][i] = gradient_value(rank, p, i, 0);
    };
    if (rank == 0) {
      fill(1), reducer.mark_ready(1);
      fill(0), reducer.mark_ready(0);
      rank0_finishing = true;
    } else {
      // Rank 1 is slower: its first bucket fills once rank 0 waits in finalize, and its
      // backward goes on for a while after.
      while (!rank0_finishing) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      fill(1), reducer.mark_ready(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      fill(0), reducer.mark_ready(0);
    }
    reducer.finalize();
    for (std::size_t p = 0; p < grads.values.size(); ++p) {
      for (std::size_t i = 0; i < grads.values[p].size(); ++i) {
        ASSERT_NEAR(grads.values[p][i], exact_average(2, p, i, 0), 1e-6);
      }
    }
  }));
  trace::set_enabled(false);
  int deferred_with_nothing_reduced = 0;
  std::uint64_t reduced = 0;
  for (const braid::testing::ReduceSpan& span : braid::testing::reduce_spans(trace::snapshot())) {
    reduced += span.bytes;
    if (span.deferred && span.bytes == 0) ++deferred_with_nothing_reduced;
  }
  // Rank 1 reduced nothing of its first bucket (of its second, too, unless it finalized
  // before rank 0 was done), and every byte of both buckets was reduced once.
  EXPECT_GE(deferred_with_nothing_reduced, 1);
  EXPECT_EQ(reduced, 2 * 40000 * sizeof(float));
}

// Largest |got - exact| over every element, after one step with `hook`.
// Each rank makes its own hook: hooks keep per-rank state (residuals, factors).
double worst_error(const std::function<std::shared_ptr<CommHook>()>& make_hook, int steps = 1) {
  double worst = 0;
  std::mutex mutex;
  expect_passed(testing::run_blocking_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    VectorGradients grads(model());
    Reducer reducer(comm, model(), grads, one_per_bucket());
    reducer.set_comm_hook(make_hook());
    for (int step = 0; step < steps; ++step) backward(reducer, grads, rank, step);
    std::lock_guard lock(mutex);
    for (std::size_t p = 0; p < grads.values.size(); ++p) {
      for (std::size_t i = 0; i < grads.values[p].size(); ++i) {
        worst = std::max(worst,
                         std::abs(double{grads.values[p][i]} - exact_average(2, p, i, steps - 1)));
      }
    }
  }));
  return worst;
}

TEST(CommHooks, F16AndBf16CompressionStayWithinTheirRounding) {
  // Values are at most 1: f16 keeps 11 significant bits, bf16 8 (plus the sum's rounding).
  EXPECT_LE(worst_error([] { return compress_hook(DType::f16); }), 1e-3);
  const double bf16 = worst_error([] { return compress_hook(DType::bf16); });
  EXPECT_LE(bf16, 8e-3);
  EXPECT_GT(bf16, 0.0) << "bf16 does round";
  EXPECT_THROW(compress_hook(DType::f32), Error);
}

TEST(CommHooks, EightBitQuantisationErrsByAtMostHalfAStepAndFeedsTheErrorBack) {
  // Per rank the step is s/127 (s = the largest |value|, <= 1/2 after the 1/W scaling);
  // the sum of two ranks errs by at most two half-steps.
  EXPECT_LE(worst_error([] { return quantize_8bit_hook(); }), 2 * 0.5 / 127 / 2 + 1e-6);
  // Error feedback: summed over many steps, what was applied tracks the true sum with an
  // error no larger than one step's (the residual carries the rest).
  constexpr int kSteps = 20;
  double drift = 0;
  std::mutex mutex;
  expect_passed(testing::run_blocking_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    VectorGradients grads(model());
    Reducer reducer(comm, model(), grads, one_per_bucket(/*rebuild=*/false));
    reducer.set_comm_hook(quantize_8bit_hook());
    std::vector<std::vector<double>> applied(3), exact(3);
    for (std::size_t p = 0; p < 3; ++p)
      applied[p].assign(grads.values[p].size(), 0), exact[p] = applied[p];
    for (int step = 0; step < kSteps; ++step) {
      backward(reducer, grads, rank, step);
      for (std::size_t p = 0; p < 3; ++p) {
        for (std::size_t i = 0; i < grads.values[p].size(); ++i) {
          applied[p][i] += grads.values[p][i];
          exact[p][i] += exact_average(2, p, i, step);
        }
      }
    }
    std::lock_guard lock(mutex);
    for (std::size_t p = 0; p < 3; ++p) {
      for (std::size_t i = 0; i < applied[p].size(); ++i)
        drift = std::max(drift, std::abs(applied[p][i] - exact[p][i]));
    }
  }));
  EXPECT_LE(drift, 2 * 0.5 / 127 / 2 + 1e-5) << "the residual, not a growing sum of errors";
}

TEST(CommHooks, PowerSgdIsExactOnLowRankGradientsAndVectors) {
  // Every rank's gradient of each matrix is the same rank-1 matrix u v^T (scaled by rank):
  // a rank-1 PowerSGD step reproduces the average exactly; the bias travels uncompressed.
  expect_passed(testing::run_blocking_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    VectorGradients grads(model());
    Reducer reducer(comm, model(), grads, one_per_bucket());
    reducer.set_comm_hook(power_sgd_hook(1, 7));
    auto fill = [&](int r) {
      for (std::size_t p = 0; p < 3; ++p) {
        const auto& spec = reducer.parameters()[p];
        const std::size_t cols =
            spec.shape.size() == 2 ? static_cast<std::size_t>(spec.shape[1]) : 1;
        for (std::size_t i = 0; i < spec.count; ++i) {
          const float u = 1.0f + static_cast<float>(i / cols);
          const float v = 0.5f - static_cast<float>(i % cols) * 0.25f;
          grads.values[p][i] = static_cast<float>(r + 1) * u * v;
        }
      }
    };
    reducer.prepare_for_backward();
    fill(rank);
    for (std::size_t p = 3; p-- > 0;) reducer.mark_ready(p);
    reducer.finalize();
    std::vector<std::vector<float>> got = grads.values;
    fill(0);  // (1 + 2) / 2 = 1.5 times rank 0's
    for (std::size_t p = 0; p < 3; ++p) {
      for (std::size_t i = 0; i < got[p].size(); ++i) {
        EXPECT_NEAR(got[p][i], 1.5f * grads.values[p][i], 1e-4)
            << "parameter " << p << " element " << i;
      }
    }
  }));
  EXPECT_THROW(power_sgd_hook(0), Error);
}

TEST(CommHooks, PowerSgdErrorFeedbackRecoversFullRankGradientsOverSteps) {
  // The same full-rank gradient every step: with error feedback the applied average over
  // many steps approaches it, far closer than one step's rank-1 approximation.
  auto mean_error = [](int steps) {
    double error = 0;
    std::mutex mutex;
    expect_passed(testing::run_blocking_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
      VectorGradients grads(model());
      Reducer reducer(comm, model(), grads, one_per_bucket(/*rebuild=*/false));
      reducer.set_comm_hook(power_sgd_hook(1, 3));
      std::vector<double> applied(30, 0);
      for (int step = 0; step < steps; ++step) {
        reducer.prepare_for_backward();
        for (std::size_t p = 3; p-- > 0;) {
          for (std::size_t i = 0; i < grads.values[p].size(); ++i)
            grads.values[p][i] = gradient_value(rank, p, i, 0);
          reducer.mark_ready(p);
        }
        reducer.finalize();
        for (std::size_t i = 0; i < 30; ++i) applied[i] += grads.values[0][i];
      }
      std::lock_guard lock(mutex);
      double sum = 0;
      for (std::size_t i = 0; i < 30; ++i)
        sum += std::abs(applied[i] / steps - exact_average(2, 0, i, 0));
      error = std::max(error, sum / 30);
    }));
    return error;
  };
  const double one = mean_error(1);
  const double many = mean_error(40);
  EXPECT_GT(one, 0.05) << "a rank-1 approximation of a full-rank 6x5 matrix is coarse";
  EXPECT_LT(many, one / 4) << "error feedback makes up for it over steps";
}

// What a hook was handed: each bucket's dtype, how it was to combine, and its first value.
struct Handed {
  DType dtype;
  ReduceOp combine;
  float first;
};

class RecordingHook final : public CommHook {
 public:
  explicit RecordingHook(bool averages) : averages_(averages) {}
  std::string_view name() const noexcept override { return "recording"; }
  bool averages() const noexcept override { return averages_; }
  asio::awaitable<void> reduce(Communicator& comm, BucketView bucket) override {
    const float first =
        bucket.data.dtype() == DType::f16
            ? collectives::f16_to_f32(*static_cast<std::uint16_t*>(bucket.data.data()))
            : *static_cast<float*>(bucket.data.data());
    handed.push_back({bucket.data.dtype(), bucket.combine, first});
    co_await comm.all_reduce(bucket.data, bucket.combine);
  }
  std::vector<Handed> handed;

 private:
  bool averages_;
};

// One f32 and one f16 parameter, 8 elements each; rank r's gradients are all r + 1.
class MixedGradients final : public GradientAccess {
 public:
  std::optional<Buffer> gradient(std::size_t index, bool) override {
    if (index == 0) return Buffer(f32);
    return Buffer(f16.data(), f16.size(), DType::f16);
  }
  void fill(float value) {
    std::fill(f32.begin(), f32.end(), value);
    std::fill(f16.begin(), f16.end(), collectives::f32_to_f16(value));
  }
  std::vector<float> f32 = std::vector<float>(8);
  std::vector<std::uint16_t> f16 = std::vector<std::uint16_t>(8);
};

// The 1/W costs no pass over the gradients when the hook can average: f32 buckets go in
// unscaled, to be averaged by the all-reduce; f16 buckets (whose unscaled sum could
// overflow) and every bucket of a hook that cannot average go in scaled, to be summed.
// Uneven shares scale by share x W, so that the average is still the weighted sum.
TEST(Reducer, LeavesTheAverageToAHookThatAveragesAndScalesForTheRest) {
  const std::vector<ParameterSpec> specs{
      ParameterSpec{.name = "w32", .count = 8, .dtype = DType::f32},
      ParameterSpec{.name = "w16", .count = 8, .dtype = DType::f16}};
  for (const bool averaging : {true, false}) {
    for (const bool weighted : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "averaging " << averaging << ", weighted " << weighted);
      expect_passed(
          testing::run_blocking_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
            MixedGradients grads;
            Reducer reducer(comm, specs, grads, one_per_bucket(false));
            auto hook = std::make_shared<RecordingHook>(averaging);
            reducer.set_comm_hook(hook);
            const double share = weighted ? (rank == 0 ? 0.25 : 0.75) : 0.5;
            if (weighted) reducer.set_batch_share(share);
            const float mine = static_cast<float>(rank + 1);
            reducer.prepare_for_backward();
            grads.fill(mine);
            reducer.mark_ready(1);
            reducer.mark_ready(0);
            reducer.finalize();
            ASSERT_EQ(hook->handed.size(), 2u);
            for (const Handed& h : hook->handed) {
              const bool averaged = averaging && h.dtype == DType::f32;
              EXPECT_EQ(h.combine, averaged ? ReduceOp::avg : ReduceOp::sum);
              EXPECT_FLOAT_EQ(h.first, averaged ? mine * static_cast<float>(share * 2)
                                                : mine * static_cast<float>(share));
            }
            // Either way every rank ends with the share-weighted sum: 1 x s0 + 2 x s1.
            const float expected = weighted ? 0.25f + 2 * 0.75f : 1.5f;
            for (const float g : grads.f32) EXPECT_FLOAT_EQ(g, expected);
            for (const std::uint16_t g : grads.f16)
              EXPECT_FLOAT_EQ(collectives::f16_to_f32(g), expected);
          }));
    }
  }
}

// A rank out of inputs shadows an iteration: it issues the same collectives (a hook's
// several per bucket, one bucket at a time, included), contributing zeros whatever its
// buckets held, so the rank still training gets its gradient over the whole world.
TEST(Reducer, AShadowIterationContributesZerosThroughEveryHook) {
  for (const bool quantized : {false, true}) {
    expect_passed(testing::run_blocking_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
      VectorGradients grads(model());
      Reducer reducer(comm, model(), grads, one_per_bucket());
      if (quantized) reducer.set_comm_hook(quantize_8bit_hook());
      backward(reducer, grads, rank, 0);  // both train: rank 1's buckets hold its gradients
      for (int step = 1; step < 3; ++step) {
        if (rank == 1) {
          reducer.shadow_iteration(/*track_unused=*/false);
          EXPECT_FALSE(reducer.in_backward());
          continue;
        }
        backward(reducer, grads, rank, step);
        // Exact, or for 8 bits within two half-steps of at most 1/2 (after the 1/W): this
        // step's rounding and the residual fed back from the last.
        const double tolerance = quantized ? 1.0 / 254 + 1e-6 : 1e-7;
        for (std::size_t p = 0; p < grads.values.size(); ++p) {
          for (std::size_t i = 0; i < grads.values[p].size(); ++i) {
            EXPECT_NEAR(grads.values[p][i], gradient_value(0, p, i, step) / 2, tolerance)
                << "parameter " << p << " element " << i << " step " << step;
          }
        }
      }
    }));
  }
}

// Error feedback is the shadowing rank's own: a shadow adds none of it and keeps it. Rank 0
// shadows step 0 (so it has no error of its own) while rank 1 trains on full-rank
// gradients (a large error); at step 1 they swap. Rank 0's rank-1 gradient then comes back
// exactly from a rank-1 PowerSGD step only if neither rank's shadow fed an error in.
TEST(CommHooks, AShadowFeedsNoErrorBackAndKeepsItsOwn) {
  expect_passed(testing::run_blocking_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    VectorGradients grads(model());
    Reducer reducer(comm, model(), grads, one_per_bucket(/*rebuild=*/false));
    reducer.set_comm_hook(power_sgd_hook(1, 7));
    if (rank == 0) {
      reducer.shadow_iteration(false);
      reducer.prepare_for_backward();
      for (std::size_t p = 0; p < 3; ++p) {  // u v^T per matrix, and a bias
        const auto& spec = reducer.parameters()[p];
        const std::size_t cols =
            spec.shape.size() == 2 ? static_cast<std::size_t>(spec.shape[1]) : 1;
        for (std::size_t i = 0; i < spec.count; ++i) {
          grads.values[p][i] =
              (1.0f + static_cast<float>(i / cols)) * (0.5f - static_cast<float>(i % cols) * 0.25f);
        }
      }
      const std::vector<std::vector<float>> mine = grads.values;
      for (std::size_t p = 3; p-- > 0;) reducer.mark_ready(p);
      reducer.finalize();
      for (std::size_t p = 0; p < 3; ++p) {
        for (std::size_t i = 0; i < mine[p].size(); ++i) {
          EXPECT_NEAR(grads.values[p][i], mine[p][i] / 2, 1e-4) << "parameter " << p << " " << i;
        }
      }
    } else {
      backward(reducer, grads, rank, 0);
      reducer.shadow_iteration(false);
    }
  }));
}

// Each rank's gradients after two trained steps with the 8-bit hook (error feedback), and
// what happens between them: nothing, an iteration every rank shadows, or a new hook
// (which starts with no residual).
enum class Between { nothing, shadow, new_hook };
std::vector<std::vector<std::vector<float>>> after_two_quantised_steps(Between between) {
  std::vector<std::vector<std::vector<float>>> result(2);
  expect_passed(testing::run_blocking_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    VectorGradients grads(model());
    Reducer reducer(comm, model(), grads, one_per_bucket(/*rebuild=*/false));
    reducer.set_comm_hook(quantize_8bit_hook());
    backward(reducer, grads, rank, 0);
    if (between == Between::shadow) reducer.shadow_iteration(false);
    if (between == Between::new_hook) reducer.set_comm_hook(quantize_8bit_hook());
    backward(reducer, grads, rank, 1);
    result[static_cast<std::size_t>(rank)] = grads.values;
  }));
  return result;
}

// The other half of a shadow's contract: the residual a rank kept from its last real step
// goes into its next one untouched, as if the shadowed iteration had not happened.
TEST(CommHooks, AShadowKeepsTheResidualForTheNextRealStep) {
  const auto plain = after_two_quantised_steps(Between::nothing);
  EXPECT_EQ(after_two_quantised_steps(Between::shadow), plain);
  // The residual shows in the second step: without it the sums differ.
  EXPECT_NE(after_two_quantised_steps(Between::new_hook), plain);
}

// Rank 0 shares its arrival order for the one rebuild. Where it shadowed the first
// synchronised iteration it has none: every rank waits for the first one rank 0 trains.
TEST(Reducer, TheRebuildWaitsForAnIterationRankZeroTrained) {
  expect_passed(testing::run_blocking_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    VectorGradients grads(model());
    Reducer reducer(comm, model(), grads, one_per_bucket());
    if (rank == 0) {
      reducer.shadow_iteration(false);
    } else {
      backward(reducer, grads, rank, 0);
    }
    EXPECT_FALSE(reducer.buckets_rebuilt());
    backward(reducer, grads, rank, 1);
    EXPECT_TRUE(reducer.buckets_rebuilt());
    for (std::size_t p = 0; p < grads.values.size(); ++p) {
      for (std::size_t i = 0; i < grads.values[p].size(); ++i) {
        EXPECT_NEAR(grads.values[p][i], exact_average(2, p, i, 1), 1e-6);
      }
    }
  }));
}

TEST(Reducer, ClipsTheGlobalGradientNormTheSameOnEveryRank) {
  std::vector<double> norms(2);
  expect_passed(testing::run_blocking_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    VectorGradients grads(model());
    Reducer reducer(comm, model(), grads);
    backward(reducer, grads, rank, 0);
    double before = 0;
    for (const auto& v : grads.values)
      for (const float x : v) before += double{x} * x;
    before = std::sqrt(before);
    const double reported = reducer.clip_grad_norm(0.5);
    EXPECT_NEAR(reported, before, 1e-4);
    double after = 0;
    for (const auto& v : grads.values)
      for (const float x : v) after += double{x} * x;
    EXPECT_NEAR(std::sqrt(after), 0.5, 1e-4);
    norms[static_cast<std::size_t>(rank)] = reported;
    EXPECT_THROW(reducer.clip_grad_norm(0), Error);
  }));
  EXPECT_EQ(norms[0], norms[1]);
}

}  // namespace
}  // namespace braid::dp
