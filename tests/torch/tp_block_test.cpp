// braid's tensor-parallel transformer block, ranks as threads: at TP 2, with and without
// sequence parallelism, it trains like its one-process twin built with the same seeds
// (the same outputs, and after several optimizer steps the same parameters, each rank's shard
// a slice of the twin's); and ColumnParallelLinear's backward starts its input-gradient
// all-reduce inside its compute span, before the weight-gradient product, as the trace
// shows.
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/torch/tensor_parallel/parallel_linear.hpp>
#include <braid/torch/tensor_parallel/parallel_transformer_block.hpp>
#include <braid/torch/tensor_parallel/tp_mappings.hpp>
#include <braid/trace/recorder.hpp>

#include "../support/scoped_env.hpp"
#include "tp_support.hpp"

namespace tp_block_test {
namespace {

using braid::collectives::Communicator;
using braid::testing::expect_close;
using braid::testing::run_tp_ranks;
using braid::testing::seeded;
using braid::testing::slice_of;
using braid::torch::ParallelTransformerBlock;
using braid::torch::ParallelTransformerBlockOptions;
using ::torch::Tensor;

constexpr std::int64_t kSeq = 8, kBatch = 2, kHidden = 16;
constexpr int kSteps = 4;

class TransformerBlockTwin : public ::testing::TestWithParam<bool> {};

TEST_P(TransformerBlockTwin, TrainsLikeItsOneProcessTwin) {
  const bool sp = GetParam();
  constexpr int t = 2;
  const ParallelTransformerBlockOptions options{
      .hidden = kHidden, .heads = 4, .ffn_hidden = 32, .sequence_parallel = sp, .seed = 5};
  run_tp_ranks(t, [&](int rank, std::shared_ptr<Communicator> comm) {
    // The twin: the same block on a group of one (every rank makes one, in the same split).
    auto alone = comm->launch(comm->split(rank, 0)).get();
    ParallelTransformerBlock block(comm, options);
    ParallelTransformerBlock twin(alone, options);
    // SGD with momentum, not Adam: the key bias's true gradient is zero (softmax ignores a
    // shift common to every key), so its computed gradient is rounding noise, which Adam
    // divides by its own size into full-sized steps that differ between any two orders
    // of summation, TP or not.
    const auto sgd = ::torch::optim::SGDOptions(0.1).momentum(0.9);
    ::torch::optim::SGD optimizer(block->parameters(), sgd);
    ::torch::optim::SGD twin_optimizer(twin->parameters(), sgd);
    const double elements = kSeq * kBatch * kHidden;
    for (int step = 0; step < kSteps; ++step) {
      const Tensor x = seeded({kSeq, kBatch, kHidden}, 100 + step);
      const Tensor target = seeded({kSeq, kBatch, kHidden}, 200 + step);

      twin_optimizer.zero_grad();
      const Tensor twin_y = twin(x);
      ((twin_y - target).square().sum() / elements).backward();
      twin_optimizer.step();

      // Under sequence parallelism each rank holds its slice of the sequence and its part
      // of the loss; otherwise every rank holds the whole output and takes the whole loss.
      optimizer.zero_grad();
      const Tensor y = block(sp ? slice_of(x, 0, rank, t) : x);
      ((y - (sp ? slice_of(target, 0, rank, t) : target)).square().sum() / elements).backward();
      braid::torch::tp::all_reduce_replicated_gradients(comm,
                                                        block->sequence_parallel_parameters());
      optimizer.step();
      expect_close(y, sp ? slice_of(twin_y, 0, rank, t) : twin_y,
                   fmt::format("rank {} step {} output", rank, step), 1e-4);
    }
    const auto dims = block->parameter_partition_dims();
    const auto twin_parameters = twin->named_parameters();
    for (const auto& named : block->named_parameters()) {
      const std::int64_t dim = dims.at(named.key());
      const Tensor& whole = twin_parameters[named.key()];
      expect_close(named.value(), dim < 0 ? whole : slice_of(whole, dim, rank, t),
                   fmt::format("rank {} {} after {} SGD steps", rank, named.key(), kSteps), 1e-4);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, TransformerBlockTwin, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "sequence_parallel" : "replicated";
                         });

// Each training thread's "tp.column_linear.backward" spans: their [begin, end), in order.
std::map<std::uint32_t, std::vector<std::pair<std::int64_t, std::int64_t>>> backward_spans(
    const braid::trace::Snapshot& snapshot) {
  std::map<std::uint32_t, std::vector<std::pair<std::int64_t, std::int64_t>>> spans;
  for (const auto& r : snapshot.records) {
    if (std::string_view(r.name) == "tp.column_linear.backward") {
      spans[r.track].emplace_back(r.begin_ns, r.end_ns);
    }
  }
  return spans;
}

// The begin times of the all-reduces recorded by the ranks' communicators.
std::vector<std::int64_t> all_reduce_begins(const braid::trace::Snapshot& snapshot) {
  std::vector<std::int64_t> begins;
  for (const auto& r : snapshot.records) {
    if (r.category == braid::trace::Category::comm &&
        std::string_view(r.name).starts_with("all_reduce")) {
      begins.push_back(r.begin_ns);
    }
  }
  return begins;
}

braid::trace::Snapshot traced_column_backward(bool overlap) {
  const braid::testing::ScopedEnv every_call("BRAID_TRACE_SAMPLE_KIB", "0");
  braid::trace::clear();
  braid::trace::set_enabled(true);
  run_tp_ranks(2, [&](int, std::shared_ptr<Communicator> comm) {
    // Big enough that the weight-gradient product (256 x 4 x 512 x 1024 multiply-adds) takes
    // tens of milliseconds, far longer than the runtime thread takes to start the
    // collective even on a loaded machine (the span begins when the runtime runs it).
    braid::torch::ColumnParallelLinear layer(
        comm, braid::torch::ColumnParallelLinearOptions{
                  .in_features = 512, .out_features = 1024, .overlap_grad_reduce = overlap});
    const Tensor x = seeded({256, 4, 512}, 1).requires_grad_(true);
    layer(x).sum().backward();
  });
  braid::trace::set_enabled(false);
  return braid::trace::snapshot();
}

TEST(ColumnParallelLinearOverlap, StartsTheInputGradientReductionInsideTheBackwardSpan) {
  const auto snapshot = traced_column_backward(true);
  const auto spans = backward_spans(snapshot);
  const auto begins = all_reduce_begins(snapshot);
  ASSERT_EQ(spans.size(), 2u) << "one training thread per rank";
  for (const auto& [track, mine] : spans) {
    ASSERT_EQ(mine.size(), 1u) << "one backward span, the reduction running inside it";
    const auto [begin, end] = mine.front();
    EXPECT_TRUE(std::any_of(begins.begin(), begins.end(),
                            [&](std::int64_t b) { return b >= begin && b < end; }))
        << "no all-reduce began inside the backward span of track " << track;
  }
}

TEST(ColumnParallelLinearOverlap, WithoutOverlapWaitsBetweenTwoComputeSpans) {
  const auto spans = backward_spans(traced_column_backward(false));
  ASSERT_EQ(spans.size(), 2u);
  for (const auto& [track, mine] : spans) {
    ASSERT_EQ(mine.size(), 2u) << "the input gradient, then (after the wait) dW and db";
    EXPECT_LE(mine[0].second, mine[1].first);
  }
}

}  // namespace
}  // namespace tp_block_test
