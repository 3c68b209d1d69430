// braid's tensor-parallel layers, ranks as threads: at TP 2 and 4, with and without
// sequence parallelism, each layer's output and its input, weight and bias gradients are
// those of the one-process layer it is a slice of; the vocabulary-parallel cross-entropy
// is libtorch's; bad shapes are refused naming the rank.
#include <string>
#include <tuple>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/tensor_parallel/parallel_linear.hpp>
#include <braid/torch/tensor_parallel/tp_mappings.hpp>
#include <braid/torch/tensor_parallel/vocab_parallel.hpp>

#include "../support/expect_error.hpp"
#include "tp_support.hpp"

namespace tp_layers_test {
namespace {

using braid::collectives::Communicator;
using braid::testing::expect_close;
using braid::testing::run_tp_ranks;
using braid::testing::seeded;
using braid::testing::slice_of;
using braid::torch::ColumnParallelLinear;
using braid::torch::ColumnParallelLinearOptions;
using braid::torch::RowParallelLinear;
using braid::torch::RowParallelLinearOptions;
namespace tp = braid::torch::tp;
using ::torch::Tensor;

constexpr std::int64_t kSeq = 8, kBatch = 2, kIn = 12, kOut = 16;

// A leaf tensor that needs a gradient.
Tensor leaf(const Tensor& t) {
  return t.detach().clone().requires_grad_(true);
}

// (tensor-parallel degree, sequence parallelism)
class TensorParallelLayer : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  int ranks() const { return std::get<0>(GetParam()); }
  bool sequence_parallel() const { return std::get<1>(GetParam()); }
};

TEST_P(TensorParallelLayer, ColumnParallelLinearIsASliceOfTheWholeLinear) {
  const bool sp = sequence_parallel();
  const int t = ranks();
  const Tensor x = seeded({kSeq, kBatch, kIn}, 1);
  const Tensor loss_weights = seeded({kSeq, kBatch, kOut}, 2);
  // One process: the whole layer, and the loss summed over the output.
  auto [w, b] = braid::torch::initial_linear_parameters(kIn, kOut, true, 7);
  const Tensor ref_x = leaf(x), ref_w = leaf(w), ref_b = leaf(b);
  const Tensor ref_y = ::torch::nn::functional::linear(ref_x, ref_w, ref_b);
  (ref_y * loss_weights).sum().backward();

  for (const bool gather_output : {false, true}) {
    if (gather_output && sp) continue;  // refused: see ColumnParallelLinearRefuses...
    run_tp_ranks(t, [&](int rank, std::shared_ptr<Communicator> comm) {
      ColumnParallelLinear layer(comm, ColumnParallelLinearOptions{.in_features = kIn,
                                                                   .out_features = kOut,
                                                                   .gather_output = gather_output,
                                                                   .sequence_parallel = sp,
                                                                   .seed = 7});
      const Tensor input = leaf(sp ? slice_of(x, 0, rank, t) : x);
      const Tensor y = layer(input);
      // Each rank's share of the loss: over its output columns; gathered, the whole loss
      // (every rank holds the whole output, and the gather's backward takes its columns).
      const Tensor loss =
          gather_output ? (y * loss_weights).sum() : (y * slice_of(loss_weights, 2, rank, t)).sum();
      loss.backward();
      const std::string where = fmt::format("rank {} gather_output {}", rank, gather_output);
      expect_close(y, gather_output ? ref_y : slice_of(ref_y, 2, rank, t), where + " output");
      expect_close(input.grad(), sp ? slice_of(ref_x.grad(), 0, rank, t) : ref_x.grad(),
                   where + " input gradient");
      expect_close(layer->weight.grad(), slice_of(ref_w.grad(), 0, rank, t),
                   where + " weight gradient");
      expect_close(layer->bias.grad(), slice_of(ref_b.grad(), 0, rank, t),
                   where + " bias gradient");
    });
  }
}

TEST_P(TensorParallelLayer, RowParallelLinearIsASliceOfTheWholeLinear) {
  const bool sp = sequence_parallel();
  const int t = ranks();
  const Tensor x = seeded({kSeq, kBatch, kOut}, 3);
  const Tensor loss_weights = seeded({kSeq, kBatch, kIn}, 4);
  auto [w, b] = braid::torch::initial_linear_parameters(kOut, kIn, true, 9);
  const Tensor ref_x = leaf(x), ref_w = leaf(w), ref_b = leaf(b);
  const Tensor ref_y = ::torch::nn::functional::linear(ref_x, ref_w, ref_b);
  (ref_y * loss_weights).sum().backward();

  for (const bool input_is_parallel : {true, false}) {
    if (!input_is_parallel && sp) continue;  // refused
    run_tp_ranks(t, [&](int rank, std::shared_ptr<Communicator> comm) {
      RowParallelLinear layer(comm, RowParallelLinearOptions{.in_features = kOut,
                                                             .out_features = kIn,
                                                             .input_is_parallel = input_is_parallel,
                                                             .sequence_parallel = sp,
                                                             .seed = 9});
      const Tensor input = leaf(input_is_parallel ? slice_of(x, 2, rank, t) : x);
      const Tensor y = layer(input);
      // The output is whole on every rank (each takes the whole loss: the gradient of a
      // reduce-from-region is the identity), or its slice of the sequence under sp.
      (y * (sp ? slice_of(loss_weights, 0, rank, t) : loss_weights)).sum().backward();
      tp::all_reduce_replicated_gradients(comm, layer->sequence_parallel_parameters());
      const std::string where =
          fmt::format("rank {} input_is_parallel {}", rank, input_is_parallel);
      expect_close(y, sp ? slice_of(ref_y, 0, rank, t) : ref_y, where + " output");
      expect_close(input.grad(),
                   input_is_parallel ? slice_of(ref_x.grad(), 2, rank, t) : ref_x.grad(),
                   where + " input gradient");
      expect_close(layer->weight.grad(), slice_of(ref_w.grad(), 1, rank, t),
                   where + " weight gradient");
      expect_close(layer->bias.grad(), ref_b.grad(), where + " bias gradient");
    });
  }
}

TEST_P(TensorParallelLayer, VocabParallelEmbeddingLooksUpEveryRanksRows) {
  const bool sp = sequence_parallel();
  const int t = ranks();
  constexpr std::int64_t kVocab = 20, kDim = 6;
  const Tensor tokens = ::torch::arange(kSeq * kBatch)
                            .remainder(kVocab)
                            .mul(7)
                            .remainder(kVocab)
                            .reshape({kSeq, kBatch});
  const Tensor loss_weights = seeded({kSeq, kBatch, kDim}, 5);
  run_tp_ranks(t, [&](int rank, std::shared_ptr<Communicator> comm) {
    braid::torch::VocabParallelEmbedding embed(
        comm, braid::torch::VocabParallelEmbeddingOptions{
                  .num_embeddings = kVocab, .dim = kDim, .sequence_parallel = sp, .seed = 11});
    // The whole table, as rank 0 of a one-rank group would make it.
    at::Generator generator = at::detail::createCPUGenerator(11);
    const Tensor table = leaf(::torch::empty({kVocab, kDim}).normal_(0, 1, generator));
    const Tensor ref_y = ::torch::embedding(table, tokens);
    (ref_y * loss_weights).sum().backward();

    const Tensor y = embed(tokens);
    (y * (sp ? slice_of(loss_weights, 0, rank, t) : loss_weights)).sum().backward();
    const std::string where = fmt::format("rank {}", rank);
    expect_close(y, sp ? slice_of(ref_y, 0, rank, t) : ref_y, where + " output");
    // Without sp every rank takes the whole loss, and the rows it holds get all of it.
    expect_close(embed->weight.grad(), slice_of(table.grad(), 0, rank, t),
                 where + " weight gradient");
  });
}

TEST_P(TensorParallelLayer, MappingsAreEachOthersTranspose) {
  const int t = ranks();
  const Tensor x = seeded({kSeq, kBatch, kOut}, 6);
  run_tp_ranks(t, [&](int rank, std::shared_ptr<Communicator> comm) {
    // copy_to_region: identity forward, gradients summed over ranks.
    const Tensor a = leaf(x);
    const Tensor copied = tp::copy_to_region(comm, a);
    expect_close(copied, x, "copy_to_region forward");
    (copied * (rank + 1)).sum().backward();
    expect_close(a.grad(), ::torch::full_like(x, t * (t + 1) / 2.0), "copy_to_region backward");
    // reduce_from_region: summed forward, identity backward.
    const Tensor c = leaf(x * (rank + 1));
    const Tensor reduced = tp::reduce_from_region(comm, c);
    expect_close(reduced, x * (t * (t + 1) / 2.0), "reduce_from_region forward");
    reduced.sum().backward();
    expect_close(c.grad(), ::torch::ones_like(x), "reduce_from_region backward");
    // scatter then gather along the last dimension: the input back; gradients likewise.
    const Tensor d = leaf(x);
    const Tensor scattered = tp::scatter_to_region(comm, d);
    expect_close(scattered, slice_of(x, 2, rank, t), "scatter_to_region forward");
    const Tensor gathered = tp::gather_from_region(comm, scattered);
    expect_close(gathered, x, "gather_from_region forward");
    (gathered * x).sum().backward();
    expect_close(d.grad(), x, "scatter/gather backward");
    // The sequence mappings: a slice of the sequence, all-gathered, reduce-scattered.
    const Tensor e = leaf(x);
    const Tensor piece = tp::scatter_to_sequence_region(comm, e);
    expect_close(piece, slice_of(x, 0, rank, t), "scatter_to_sequence_region forward");
    const Tensor whole = tp::gather_from_sequence_region(comm, piece, false);
    expect_close(whole, x, "gather_from_sequence_region forward");
    const Tensor summed = tp::reduce_scatter_to_sequence_region(comm, whole * (rank + 1));
    expect_close(summed, slice_of(x, 0, rank, t) * (t * (t + 1) / 2.0),
                 "reduce_scatter_to_sequence_region forward");
    summed.sum().backward();
    // Backward: the reduce-scatter's all-gather gives every rank ones, scaled by rank + 1;
    // the gather (grad_is_partial false) keeps this rank's slice of it, and the scatter's
    // all-gather lays the ranks' slices end to end: slice j holds j + 1.
    const Tensor expected =
        ::torch::arange(1, t + 1, x.options()).repeat_interleave(kSeq / t).view({kSeq, 1, 1});
    expect_close(e.grad(), expected.expand_as(x), "sequence mappings backward");
  });
}

INSTANTIATE_TEST_SUITE_P(Degrees, TensorParallelLayer,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return fmt::format(
                               "tp{}_{}", std::get<0>(info.param),
                               std::get<1>(info.param) ? "sequence_parallel" : "replicated");
                         });

TEST(VocabParallelCrossEntropy, EqualsLibtorchsCrossEntropyOverTheWholeVocabulary) {
  constexpr std::int64_t kVocab = 24;
  const Tensor logits = seeded({kSeq, kBatch, kVocab}, 8) * 4;
  const Tensor targets =
      ::torch::arange(kSeq * kBatch).mul(5).remainder(kVocab).reshape({kSeq, kBatch});
  const Tensor ref_logits = leaf(logits);
  const Tensor ref_loss =
      ::torch::nn::functional::cross_entropy(
          ref_logits.reshape({-1, kVocab}), targets.reshape({-1}),
          ::torch::nn::functional::CrossEntropyFuncOptions().reduction(::torch::kNone))
          .reshape({kSeq, kBatch});
  ref_loss.mean().backward();
  for (const int t : {2, 4}) {
    run_tp_ranks(t, [&](int rank, std::shared_ptr<Communicator> comm) {
      const Tensor mine = leaf(slice_of(logits, 2, rank, t));
      const Tensor loss = braid::torch::vocab_parallel_cross_entropy(comm, mine, targets);
      loss.mean().backward();
      expect_close(loss, ref_loss, fmt::format("tp {} rank {} loss", t, rank));
      expect_close(mine.grad(), slice_of(ref_logits.grad(), 2, rank, t),
                   fmt::format("tp {} rank {} logits gradient", t, rank));
    });
  }
}

TEST(TensorParallelLayers, RefuseShapesThatDoNotSplitNamingTheRank) {
  using braid::testing::expect_invalid_argument;
  run_tp_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    expect_invalid_argument(
        [&] {
          ColumnParallelLinear(comm,
                               ColumnParallelLinearOptions{.in_features = 4, .out_features = 5});
        },
        fmt::format("rank {}: ColumnParallelLinear: invalid argument: out_features 5 must be "
                    "positive and divide by the tensor-parallel degree 2",
                    rank));
    expect_invalid_argument(
        [&] {
          RowParallelLinear(comm, RowParallelLinearOptions{.in_features = 3, .out_features = 4});
        },
        "in_features 3 must be positive and divide by the tensor-parallel degree 2");
    ColumnParallelLinear layer(comm,
                               ColumnParallelLinearOptions{.in_features = 4, .out_features = 6});
    expect_invalid_argument(
        [&] {
          layer(::torch::ones({2, 5}));
        },
        "input of shape [2, 5]: its last dimension must be 4");
    expect_invalid_argument(
        [&] {
          ColumnParallelLinear(comm, ColumnParallelLinearOptions{.in_features = 4,
                                                                 .out_features = 6,
                                                                 .gather_output = true,
                                                                 .sequence_parallel = true});
        },
        "gather_output and sequence_parallel together");
    expect_invalid_argument(
        [&] {
          braid::torch::VocabParallelEmbedding(
              comm, braid::torch::VocabParallelEmbeddingOptions{.num_embeddings = 7, .dim = 2});
        },
        "num_embeddings 7 must be positive and divide by the tensor-parallel degree 2");
    braid::torch::VocabParallelEmbedding embed(
        comm, braid::torch::VocabParallelEmbeddingOptions{.num_embeddings = 8, .dim = 2});
    expect_invalid_argument(
        [&] {
          embed(::torch::tensor({1, 8}));
        },
        "token ids range over [1, 8], outside the vocabulary [0, 8)");
    expect_invalid_argument(
        [&] {
          braid::torch::vocab_parallel_cross_entropy(comm, ::torch::zeros({3, 4}),
                                                     ::torch::zeros({2}, ::torch::kLong));
        },
        "targets of shape [2] for logits of shape [3, 4]");
  });
}

}  // namespace
}  // namespace tp_layers_test
