// braid::torch::DistributedDataParallel, ranks as threads (each with its own Runtime,
// World and Communicator; libtorch runs each thread's backward on that thread): the
// contract PyTorch DDP users rely on, and the errors they hit.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>
#include <braid/trace/recorder.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/world.hpp>

#include "../support/expect_error.hpp"
#include "../support/rank_threads.hpp"

namespace ddp_test {
namespace {

using braid::Buffer;
using braid::ReduceOp;
using braid::Runtime;
using braid::collectives::Communicator;
using braid::torch::DistributedDataParallel;
using braid::torch::DistributedDataParallelOptions;
namespace transport = braid::transport;
// libtorch runs each thread's backward on that thread, so ranks can be threads.
std::vector<std::string> run_ranks(int size, const braid::testing::BlockingRankBody& body) {
  return braid::testing::run_blocking_ranks(size,
                                            [&](int rank, std::shared_ptr<Communicator> comm) {
                                              ::torch::set_num_threads(1);
                                              body(rank, std::move(comm));
                                            });
}

using braid::testing::expect_all_passed;

struct NetImpl : ::torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", ::torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", ::torch::nn::Linear(16, 16));
    fc3 = register_module("fc3", ::torch::nn::Linear(16, 1));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) {
    return fc3->forward(::torch::relu(fc2->forward(::torch::relu(fc1->forward(x)))));
  }
  ::torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Net);

// libtorch's default generator is one per process: rank threads seeding and drawing at
// once would interleave, so seeding and drawing happen under one lock.
std::mutex rng_mutex;

Net make_net(int seed) {
  std::lock_guard lock(rng_mutex);
  ::torch::manual_seed(seed);
  return Net();
}

std::pair<::torch::Tensor, ::torch::Tensor> data(int rank, int step, int rows = 4) {
  std::lock_guard lock(rng_mutex);
  ::torch::manual_seed(100 * step + rank + 1);
  auto x = ::torch::randn({rows, 8});
  return {x, ::torch::randn({rows, 1})};
}

std::vector<::torch::Tensor> snapshot(Net& net) {
  std::vector<::torch::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

std::vector<::torch::Tensor> gradients(Net& net) {
  std::vector<::torch::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.grad().clone());
  return out;
}

// Tensor by tensor, `got` is within the tolerances of `expected`.
void expect_all_close(const std::vector<::torch::Tensor>& got,
                      const std::vector<::torch::Tensor>& expected, const char* what,
                      double rtol = 1e-5, double atol = 1e-6) {
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(::torch::allclose(got[i], expected[i], rtol, atol)) << what << " " << i;
  }
}

// Tiny buckets so a 3-layer net spans several.
DistributedDataParallelOptions small_buckets() {
  DistributedDataParallelOptions options;
  options.limits = {.first_bucket_bytes = 64, .bucket_cap_bytes = 256};
  return options;
}

// Runs `body(view)` with gradients as bucket views, then in copy mode, each failure
// traced to its mode.
template <class Body>
void in_both_gradient_modes(Body&& body) {
  for (const bool view : {true, false}) {
    SCOPED_TRACE(view ? "gradients as bucket views" : "copy mode");
    body(view);
  }
}

DistributedDataParallelOptions finding_unused(bool bucket_view = true) {
  DistributedDataParallelOptions options;
  options.find_unused_parameters = true;
  options.gradient_as_bucket_view = bucket_view;
  return options;
}

TEST(DistributedDataParallel, EveryRankHoldsBitIdenticalParametersAfterTraining) {
  std::vector<std::vector<::torch::Tensor>> finals(2);
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net net = make_net(rank + 7);  // different initial weights: rank 0's are broadcast
    DistributedDataParallel ddp(net, comm, small_buckets());
    ::torch::optim::SGD opt(net->parameters(), 0.1);
    for (int step = 0; step < 5; ++step) {
      auto [x, y] = data(rank, step);
      opt.zero_grad();
      ::torch::mse_loss(ddp.forward(x), y).backward();
      opt.step();
    }
    EXPECT_GT(ddp.reducer().bucket_count(), 1u);
    finals[static_cast<std::size_t>(rank)] = snapshot(net);
  }));
  ASSERT_EQ(finals[0].size(), finals[1].size());
  for (std::size_t i = 0; i < finals[0].size(); ++i) {
    EXPECT_TRUE(::torch::equal(finals[0][i], finals[1][i])) << "parameter " << i;
  }
}

TEST(DistributedDataParallel, MatchesOneProcessTrainingOnTheConcatenatedBatch) {
  constexpr int kSteps = 4;
  Net reference = make_net(7);
  ::torch::optim::SGD ref_opt(reference->parameters(), 0.1);
  for (int step = 0; step < kSteps; ++step) {
    auto [x0, y0] = data(0, step);
    auto [x1, y1] = data(1, step);
    ref_opt.zero_grad();
    ::torch::mse_loss(reference->forward(::torch::cat({x0, x1})), ::torch::cat({y0, y1}))
        .backward();
    ref_opt.step();
  }
  std::vector<::torch::Tensor> rank0;
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net net = make_net(7);
    DistributedDataParallel ddp(net, comm, small_buckets());
    ::torch::optim::SGD opt(net->parameters(), 0.1);
    for (int step = 0; step < kSteps; ++step) {
      auto [x, y] = data(rank, step);
      opt.zero_grad();
      ::torch::mse_loss(ddp.forward(x), y).backward();
      opt.step();
    }
    if (rank == 0) rank0 = snapshot(net);
  }));
  expect_all_close(rank0, snapshot(reference), "parameter");
}

TEST(DistributedDataParallel, GradientsAsBucketViewsTrainTheSameWithoutCopies) {
  constexpr int kSteps = 4;
  auto train = [](bool view) {
    std::vector<::torch::Tensor> rank0;
    expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
      Net net = make_net(7);
      DistributedDataParallelOptions options = small_buckets();
      options.gradient_as_bucket_view = view;
      DistributedDataParallel ddp(net, comm, options);
      ::torch::optim::SGD opt(net->parameters(), 0.1);
      const void* first = nullptr;
      for (int step = 0; step < kSteps; ++step) {
        auto [x, y] = data(rank, step);
        opt.zero_grad();
        ::torch::mse_loss(ddp.forward(x), y).backward();
        opt.step();
        // After the rebuild (step 0) a view stays the same memory from step to step.
        if (view && step == 1) first = net->fc1->weight.grad().data_ptr();
        if (view && step > 1) {
          EXPECT_EQ(net->fc1->weight.grad().data_ptr(), first);
        }
      }
      if (rank == 0) rank0 = snapshot(net);
    }));
    return rank0;
  };
  const auto copied = train(false);
  const auto viewed = train(true);
  expect_all_close(copied, viewed, "parameter", 1e-6, 1e-7);
}

// Bucket-view gradients share their bucket's memory: they stay readable after the wrapper
// is gone (the buckets are large enough to be unmapped when freed, so a dangling view
// would crash). A gradient set to none comes back as a view at the next backward.
TEST(DistributedDataParallel, BucketViewGradientsOutliveTheWrapperAndComeBackAfterSetToNone) {
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    ::torch::nn::Linear net = [] {
      std::lock_guard lock(rng_mutex);
      ::torch::manual_seed(3);
      return ::torch::nn::Linear(256, 256);  // a 256 KiB weight: its own mapping
    }();
    ::torch::Tensor kept;
    ::torch::Tensor expected;
    {
      DistributedDataParallelOptions options;
      options.gradient_as_bucket_view = true;
      DistributedDataParallel ddp(net, comm, options);
      auto step = [&](int i) {
        ::torch::Tensor x;
        {
          std::lock_guard lock(rng_mutex);
          ::torch::manual_seed(10 * i + rank);
          x = ::torch::randn({4, 256});
        }
        ddp.forward(x).pow(2).sum().backward();
      };
      step(0);  // buckets rebuilt after this one
      net->weight.mutable_grad().zero_();
      step(1);
      const void* view = net->weight.grad().data_ptr();
      net->weight.mutable_grad() = ::torch::Tensor();  // zero_grad(set_to_none)
      net->bias.mutable_grad() = ::torch::Tensor();
      step(2);
      EXPECT_EQ(net->weight.grad().data_ptr(), view) << "the gradient is a bucket view again";
      kept = net->weight.grad();
      expected = kept.clone();
    }
    // The wrapper and its reducer are gone; the gradients still read their bucket.
    EXPECT_TRUE(::torch::equal(net->weight.grad(), expected));
    EXPECT_TRUE(::torch::equal(kept, expected));
    EXPECT_GT(expected.abs().sum().item<double>(), 0.0);
  }));
}

TEST(DistributedDataParallel, NoSyncAccumulatesAndTheNextBackwardReducesTheSum) {
  // Two micro-batches per rank, the first under no_sync: the gradient equals the
  // average over ranks of each rank's summed micro-batch gradients.
  Net reference = make_net(3);
  for (int rank = 0; rank < 2; ++rank) {
    for (int micro = 0; micro < 2; ++micro) {
      auto [x, y] = data(rank, micro);
      (::torch::mse_loss(reference->forward(x), y) / 2).backward();  // /2: the rank average
    }
  }
  const std::vector<::torch::Tensor> expected = gradients(reference);
  std::vector<::torch::Tensor> got;
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net net = make_net(3);
    DistributedDataParallel ddp(net, comm, small_buckets());
    {
      auto guard = ddp.no_sync();
      auto [x, y] = data(rank, 0);
      ::torch::mse_loss(ddp.forward(x), y).backward();
    }
    auto [x, y] = data(rank, 1);
    ::torch::mse_loss(ddp.forward(x), y).backward();
    if (rank == 0) got = gradients(net);
  }));
  expect_all_close(got, expected, "gradient");
}

// fc_rank1 is used by rank 1 only; fc_never by nobody.
struct BranchyImpl : ::torch::nn::Module {
  BranchyImpl() {
    trunk = register_module("trunk", ::torch::nn::Linear(4, 4));
    fc_rank1 = register_module("fc_rank1", ::torch::nn::Linear(4, 4));
    fc_never = register_module("fc_never", ::torch::nn::Linear(4, 4));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x, bool use_branch) {
    auto h = trunk->forward(x);
    return use_branch ? fc_rank1->forward(h) : h;
  }
  ::torch::nn::Linear trunk{nullptr}, fc_rank1{nullptr}, fc_never{nullptr};
};
TORCH_MODULE(Branchy);

// In both gradient modes: a parameter nobody used keeps no gradient, so an optimizer skips
// it (no momentum step, no weight decay), even where its gradient would be a bucket view.
TEST(DistributedDataParallel, FindsUnusedParametersLocallyZeroGloballyUntouched) {
  in_both_gradient_modes([&](bool view) {
    std::vector<std::string> errors =
        run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
          Branchy net;
          DistributedDataParallel ddp(net, comm, finding_unused(view));
          const ::torch::Tensor never_before = net->fc_never->weight.clone();
          ::torch::optim::SGD opt(net->parameters(),
                                  ::torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.1));
          for (int step = 0; step < 2; ++step) {
            opt.zero_grad();
            auto x = data(rank, step).first.narrow(1, 0, 4);
            ddp.forward(x, rank == 1).sum().backward();
            // Rank 1's branch gradient, averaged with rank 0's zero contribution.
            ASSERT_TRUE(net->fc_rank1->weight.grad().defined());
            EXPECT_FALSE(net->fc_never->weight.grad().defined()) << "unused everywhere: left alone";
            EXPECT_TRUE(net->trunk->weight.grad().defined());
            std::vector<float> norm{net->fc_rank1->weight.grad().norm().item<float>()};
            std::vector<float> low = norm;
            comm->launch(comm->all_reduce(Buffer(low), ReduceOp::min)).get();
            EXPECT_EQ(low[0], norm[0]) << "both ranks hold the same averaged gradient";
            EXPECT_GT(norm[0], 0.0f);
            opt.step();
          }
          EXPECT_TRUE(::torch::equal(net->fc_never->weight, never_before))
              << "the optimizer moved a parameter that never had a gradient";
        });
    expect_all_passed(errors);
  });
}

// As in PyTorch's DDP: a parameter this rank leaves unused in the synchronised step still
// contributes the gradient it accumulated under no_sync(), not zeros.
TEST(DistributedDataParallel,
     AGradientAccumulatedUnderNoSyncCountsWhereTheSyncedStepLeavesItUnused) {
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Branchy net;
    DistributedDataParallel ddp(net, comm, finding_unused());
    // This rank's own gradient of the branch over both steps, from a copy of the weights
    // (rank 0's, after the broadcast): step 0 uses the branch everywhere, step 1 on rank 1.
    Branchy copy;
    {
      ::torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < net->parameters().size(); ++i) {
        copy->parameters()[i].copy_(net->parameters()[i]);
      }
    }
    auto x0 = data(rank, 0).first.narrow(1, 0, 4);
    auto x1 = data(rank, 1).first.narrow(1, 0, 4);
    copy->forward(x0, true).sum().backward();
    copy->forward(x1, rank == 1).sum().backward();
    std::vector<float> expected(16);
    std::memcpy(expected.data(), copy->fc_rank1->weight.grad().contiguous().data_ptr<float>(),
                16 * sizeof(float));
    comm->launch(comm->all_reduce(Buffer(expected), ReduceOp::avg)).get();
    {
      auto guard = ddp.no_sync();
      ddp.forward(x0, true).sum().backward();
    }
    ddp.forward(x1, rank == 1).sum().backward();
    const ::torch::Tensor got = net->fc_rank1->weight.grad().contiguous();
    for (std::size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(got.data_ptr<float>()[i], expected[i], 1e-5)
          << "rank " << rank << " element " << i;
    }
  }));
}

// A gradient first made under no_sync() has memory of its own, not its bucket's. Where
// no rank uses its parameter in the synchronised step, it keeps what no_sync() gave it,
// in both gradient modes (with bucket views it must not become a view of the all-reduced
// bucket; found in review).
TEST(DistributedDataParallel, AGradientOnlyNoSyncMadeStaysAsItWasWhereNobodyUsesItInTheSync) {
  in_both_gradient_modes([&](bool view) {
    expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
      Branchy net;
      DistributedDataParallel ddp(net, comm, finding_unused(view));
      auto x = data(rank, 0).first.narrow(1, 0, 4);
      {
        auto guard = ddp.no_sync();
        ddp.forward(x, true).sum().backward();
      }
      const ::torch::Tensor before = net->fc_rank1->weight.grad().clone();
      ddp.forward(x, false).sum().backward();
      EXPECT_TRUE(::torch::equal(net->fc_rank1->weight.grad(), before)) << "rank " << rank;
      // Used again later, it is a bucket view like the others.
      ddp.forward(x, true).sum().backward();
      EXPECT_TRUE(net->fc_rank1->weight.grad().defined());
    }));
  });
}

TEST(DistributedDataParallel, StaticGraphReusesTheFirstIterationsUnusedSet) {
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Branchy net;
    DistributedDataParallelOptions options = finding_unused();
    options.static_graph = true;
    DistributedDataParallel ddp(net, comm, options);
    for (int step = 0; step < 3; ++step) {
      net->zero_grad();
      auto x = data(rank, step).first.narrow(1, 0, 4);
      ddp.forward(x, rank == 1).sum().backward();
      EXPECT_TRUE(net->fc_rank1->weight.grad().defined()) << "step " << step;
      EXPECT_FALSE(net->fc_never->weight.grad().defined()) << "step " << step;
    }
  }));
}

TEST(DistributedDataParallel, RebuildsBucketsOnceFromTheOrderGradientsArrived) {
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net net = make_net(1);
    DistributedDataParallelOptions options;
    options.limits = {.first_bucket_bytes = 4, .bucket_cap_bytes = 4};  // one parameter each
    DistributedDataParallel ddp(net, comm, options);
    EXPECT_FALSE(ddp.reducer().buckets_rebuilt());
    // Initially reverse declaration order: fc3.bias is the first bucket.
    EXPECT_EQ(ddp.reducer().parameters()[ddp.reducer().bucket(0).parameters[0]].name, "fc3.bias");
    auto [x, y] = data(rank, 0);
    ::torch::mse_loss(ddp.forward(x), y).backward();
    EXPECT_TRUE(ddp.reducer().buckets_rebuilt());
    // Backward produces fc3's gradients first; autograd decides weight or bias first. The
    // rebuilt order is rank 0's arrival order, the same on both ranks.
    std::vector<std::int64_t> firsts;
    for (std::size_t b = 0; b < ddp.reducer().bucket_count(); ++b) {
      firsts.push_back(static_cast<std::int64_t>(ddp.reducer().bucket(b).parameters[0]));
    }
    std::vector<std::int64_t> rank0 = firsts;
    comm->launch(comm->broadcast(Buffer(rank0), 0)).get();
    EXPECT_EQ(firsts, rank0);
    EXPECT_TRUE(
        ddp.reducer().parameters()[static_cast<std::size_t>(firsts[0])].name.starts_with("fc3"));
    // Training goes on with the new buckets.
    auto [x2, y2] = data(rank, 1);
    ::torch::mse_loss(ddp.forward(x2), y2).backward();
  }));
}

TEST(DistributedDataParallel, UnevenBatchSharesWeighTheGradients) {
  // Rank 0 has 3 rows, rank 1 one: shares 3/4 and 1/4 reproduce the mean over all 4.
  Net reference = make_net(9);
  auto [x0, y0] = data(0, 0, 3);
  auto [x1, y1] = data(1, 0, 1);
  ::torch::mse_loss(reference->forward(::torch::cat({x0, x1})), ::torch::cat({y0, y1})).backward();
  const std::vector<::torch::Tensor> expected = gradients(reference);
  std::vector<::torch::Tensor> got;
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net net = make_net(9);
    DistributedDataParallel ddp(net, comm);
    const int rows = rank == 0 ? 3 : 1;
    ddp.reducer().set_batch_share(rows / 4.0);
    auto [x, y] = data(rank, 0, rows);
    ::torch::mse_loss(ddp.forward(x), y).backward();
    if (rank == 0) got = gradients(net);
  }));
  expect_all_close(got, expected, "gradient");
}

// What braid-trace's summary reads for a DDP run: each bucket from full to reduced, with
// the moment it launched inside; the write-back; forward and backward compute spans.
TEST(DistributedDataParallel, TracesEachBucketFromFullToReducedWithItsLaunchInside) {
  braid::trace::clear();
  braid::trace::set_enabled(true);
  std::size_t buckets = 0;
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net net = make_net(5);
    DistributedDataParallel ddp(net, comm, small_buckets());
    auto [x, y] = data(rank, 0);
    ::torch::mse_loss(ddp.forward(x), y).backward();
    if (rank == 0) buckets = ddp.reducer().bucket_count();
  }));
  braid::trace::set_enabled(false);
  std::vector<braid::trace::Record> spans, launches;
  std::map<std::string, int> count;
  for (const braid::trace::Record& record : braid::trace::snapshot().records) {
    const std::string name = record.name;
    ++count[name];
    if (name == "bucket") spans.push_back(record);
    if (name == "bucket.launched") launches.push_back(record);
  }
  ASSERT_GT(buckets, 1u);
  EXPECT_EQ(spans.size(), 2 * buckets) << "one per bucket per rank";
  EXPECT_EQ(launches.size(), spans.size());
  EXPECT_EQ(count["bucket.write_back"], 2);
  EXPECT_EQ(count["forward"], 2);
  EXPECT_EQ(count["backward"], 2);
  std::set<std::int64_t> indices;
  for (const braid::trace::Record& span : spans) {
    ASSERT_EQ(span.arg_count, 1);
    EXPECT_STREQ(span.args[0].key, "bucket");
    indices.insert(span.args[0].value);
    const bool launched_inside = std::any_of(launches.begin(), launches.end(), [&](const auto& l) {
      return l.bytes == span.bytes && l.begin_ns >= span.begin_ns && l.begin_ns <= span.end_ns;
    });
    EXPECT_TRUE(launched_inside) << "bucket " << span.args[0].value;
  }
  EXPECT_EQ(indices.size(), buckets);
}

// ---------------------------------------------------------------- uneven inputs

// Rank r has 2 + r batches. While some ranks train on, the joined ones contribute zero
// gradients and the average divides by all three, as PyTorch's join() does by default;
// at the end every rank holds the parameters of rank 2, the one that trained longest.
TEST(DistributedDataParallelUnevenInputs, JoinedRanksShadowTheOthersAndEndWithTheirModel) {
  constexpr int kRanks = 3;
  auto batches = [](int rank) { return 2 + rank; };
  Net reference = make_net(11);
  ::torch::optim::SGD ref_opt(reference->parameters(), 0.1);
  for (int step = 0; step < batches(kRanks - 1); ++step) {
    ref_opt.zero_grad();
    for (int rank = 0; rank < kRanks; ++rank) {
      if (step >= batches(rank)) continue;  // joined: contributes zeros
      auto [x, y] = data(rank, step);
      (::torch::mse_loss(reference->forward(x), y) / kRanks).backward();
    }
    ref_opt.step();
  }
  std::vector<std::vector<::torch::Tensor>> finals(kRanks);
  std::vector<DistributedDataParallel<Net>::Joined> joined(kRanks);
  expect_all_passed(run_ranks(kRanks, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net net = make_net(11);
    DistributedDataParallel ddp(net, comm, small_buckets());
    ::torch::optim::SGD opt(net->parameters(), 0.1);
    ddp.allow_uneven_inputs();
    for (int step = 0; step < batches(rank); ++step) {
      auto [x, y] = data(rank, step);
      opt.zero_grad();
      ::torch::mse_loss(ddp.forward(x), y).backward();
      opt.step();
    }
    joined[static_cast<std::size_t>(rank)] = ddp.join();
    finals[static_cast<std::size_t>(rank)] = snapshot(net);
    // Back to even inputs: a plain synchronised step works again.
    auto [x, y] = data(rank, 9);
    ::torch::mse_loss(ddp.forward(x), y).backward();
  }));
  for (int rank = 0; rank < kRanks; ++rank) {
    const auto r = static_cast<std::size_t>(rank);
    EXPECT_EQ(joined[r].shadowed_forwards, static_cast<std::size_t>(2 - rank)) << rank;
    EXPECT_EQ(joined[r].parameters_from, 2) << rank;
    for (std::size_t i = 0; i < finals[0].size(); ++i) {
      EXPECT_TRUE(::torch::equal(finals[r][i], finals[0][i])) << "rank " << rank << " param " << i;
    }
  }
  expect_all_close(finals[0], snapshot(reference), "parameter");
}

// A rank with no batch at all, while the other accumulates under no_sync() and tracks
// unused parameters: the joined rank shadows exactly the synchronised iterations,
// contributing zero gradients and no used parameter.
TEST(DistributedDataParallelUnevenInputs, ARankWithNoBatchShadowsNoSyncAndUnusedTracking) {
  // With bucket views, the branch's gradient is its bucket's memory, which the all-reduce
  // overwrites: where nobody used it, the reducer puts back what no_sync() accumulated.
  in_both_gradient_modes([&](bool view) {
    expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
      Branchy net;
      DistributedDataParallel ddp(net, comm, finding_unused(view));
      ::torch::optim::SGD opt(net->parameters(), 0.1);
      ddp.allow_uneven_inputs();
      if (rank == 1) {
        for (int step = 0; step < 3; ++step) {
          auto x = data(rank, step).first.narrow(1, 0, 4);
          // This rank's own gradients of the step, from a copy of the current weights.
          Branchy copy;
          {
            ::torch::NoGradGuard no_grad;
            for (std::size_t i = 0; i < copy->parameters().size(); ++i)
              copy->parameters()[i].copy_(net->parameters()[i]);
          }
          copy->forward(x, true).sum().backward();
          copy->forward(x, step % 2 == 0).sum().backward();
          opt.zero_grad();
          {
            auto guard = ddp.no_sync();
            ddp.forward(x, true).sum().backward();
          }
          ddp.forward(x, step % 2 == 0).sum().backward();
          // Rank 0 contributed zeros: the average is half of ours. In odd steps no rank used
          // the branch in the synchronised forward, so it keeps what no_sync() accumulated.
          EXPECT_TRUE(::torch::allclose(net->trunk->weight.grad(), copy->trunk->weight.grad() / 2))
              << "step " << step;
          const double branch_share = step % 2 == 0 ? 0.5 : 1.0;
          EXPECT_TRUE(::torch::allclose(net->fc_rank1->weight.grad(),
                                        copy->fc_rank1->weight.grad() * branch_share))
              << "step " << step;
          EXPECT_FALSE(net->fc_never->weight.grad().defined()) << "nobody used it: left alone";
          opt.step();
        }
      }
      const auto joined = ddp.join();
      // Six forwards on rank 1, three of them synchronised; rank 0 shadowed all six.
      EXPECT_EQ(joined.shadowed_forwards, rank == 0 ? 6u : 0u);
      EXPECT_EQ(joined.parameters_from, 1);
      std::vector<float> sum{net->trunk->weight.sum().item<float>() +
                             net->fc_rank1->weight.sum().item<float>()};
      std::vector<float> low = sum;
      comm->launch(comm->all_reduce(Buffer(low), ReduceOp::min)).get();
      EXPECT_EQ(low[0], sum[0]) << "every rank left join() with rank 1's model";
    }));
  });
}

struct NormalisedImpl : ::torch::nn::Module {
  NormalisedImpl() {
    norm = register_module("norm", ::torch::nn::BatchNorm1d(8));
    fc = register_module("fc", ::torch::nn::Linear(8, 1));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) { return fc->forward(norm->forward(x)); }
  ::torch::nn::BatchNorm1d norm{nullptr};
  ::torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Normalised);

// Buffers come from the lowest rank still training: once rank 0 has joined, rank 1 keeps
// its own running statistics, and everyone ends with them.
TEST(DistributedDataParallelUnevenInputs, BuffersComeFromTheRanksStillTraining) {
  // Rank 1 alone, three batches: the statistics every rank must end with.
  ::torch::nn::BatchNorm1d reference(8);
  for (int step = 0; step < 3; ++step) reference->forward(data(1, step).first);
  expect_all_passed(run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Normalised net;
    DistributedDataParallel ddp(net, comm);
    ::torch::optim::SGD opt(net->parameters(), 0.1);
    ddp.allow_uneven_inputs();
    for (int step = 0; step < (rank == 0 ? 1 : 3); ++step) {
      auto [x, y] = data(rank, step);
      opt.zero_grad();
      ::torch::mse_loss(ddp.forward(x), y).backward();
      opt.step();
    }
    EXPECT_EQ(ddp.join().parameters_from, 1);
    EXPECT_TRUE(::torch::allclose(net->norm->running_mean, reference->running_mean))
        << net->norm->running_mean << reference->running_mean;
    EXPECT_TRUE(::torch::allclose(net->norm->running_var, reference->running_var));
  }));
}

// ---------------------------------------------------------------- misuse

void expect_error_on(const std::vector<std::string>& errors, std::size_t rank,
                     const std::string& says) {
  ASSERT_NE(errors[rank], "") << "rank " << rank << " should have failed";
  EXPECT_NE(errors[rank].find(says), std::string::npos) << errors[rank];
}

TEST(DistributedDataParallelMisuse, BackwardTwiceAfterOneForwardMarksAParameterReadyTwice) {
  const auto errors = run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net net = make_net(1);
    DistributedDataParallel ddp(net, comm);
    auto [x, y] = data(rank, 0);
    auto loss = ::torch::mse_loss(ddp.forward(x), y);
    loss.backward({}, /*retain_graph=*/true);
    loss.backward();
  });
  for (std::size_t r = 0; r < 2; ++r) expect_error_on(errors, r, "marked ready twice");
}

TEST(DistributedDataParallelMisuse, ANewForwardBeforeTheLastBackwardIsRefused) {
  const auto errors = run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net net = make_net(1);
    DistributedDataParallel ddp(net, comm);
    auto [x, y] = data(rank, 0);
    auto unused = ddp.forward(x);
    ddp.forward(x);
  });
  for (std::size_t r = 0; r < 2; ++r) expect_error_on(errors, r, "did not finish");
}

// With uneven inputs, ranks 0 and 1 leave a forward without its backward (say, a loss
// that threw and was caught) and run another, which their wrappers refuse. Rank 2 has
// joined: it is shadowing the abandoned iteration's buckets, which nobody else reduces.
// The refusing ranks still make the forward's notice call, and on one node the
// shared-memory fingerprint check fails rank 2 against it at once. When they threw before
// that call, rank 2 waited out the communicator's 20 s deadline.
TEST(DistributedDataParallelMisuse, ARefusedForwardWithUnevenInputsFailsTheJoinedRanksAtOnce) {
  const auto started = std::chrono::steady_clock::now();
  const auto errors = run_ranks(3, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net net = make_net(1);
    DistributedDataParallel ddp(net, comm);
    ddp.allow_uneven_inputs();
    if (rank == 2) {
      ddp.join();
      return;
    }
    auto [x, y] = data(rank, 0);
    ::torch::mse_loss(ddp.forward(x), y).backward();
    auto abandoned = ddp.forward(x);  // no backward
    ddp.forward(x);
  });
  for (std::size_t r : {0, 1}) expect_error_on(errors, r, "did not finish");
  expect_error_on(errors, 2, "counts or dtypes differ across ranks");
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
}

TEST(DistributedDataParallelMisuse, ParametersWithoutGradientsAreNamedAtTheEndOfBackward) {
  const auto errors = run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Branchy net;
    DistributedDataParallel ddp(net, comm);  // no find_unused_parameters
    auto x = data(rank, 0).first.narrow(1, 0, 4);
    ddp.forward(x, true).sum().backward();
  });
  for (std::size_t r = 0; r < 2; ++r) {
    expect_error_on(errors, r, "fc_never.weight");
    expect_error_on(errors, r, "find_unused_parameters");
  }
}

TEST(DistributedDataParallelMisuse, RanksDisagreeingOnNoSyncUnderUnevenInputsFailTogether) {
  const auto errors = run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net net = make_net(1);
    DistributedDataParallel ddp(net, comm);
    ddp.allow_uneven_inputs();
    auto [x, y] = data(rank, 0);
    if (rank == 0) {
      auto guard = ddp.no_sync();
      ::torch::mse_loss(ddp.forward(x), y).backward();
    } else {
      ::torch::mse_loss(ddp.forward(x), y).backward();
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    expect_error_on(errors, r, "disagree on whether");
    expect_error_on(errors, r, "rank 1 does, rank 0 runs its forward under no_sync()");
  }
}

TEST(DistributedDataParallelMisuse, JoinWithoutAllowingUnevenInputsIsRefused) {
  const auto errors = run_ranks(2, [&](int, std::shared_ptr<Communicator> comm) {
    Net net = make_net(1);
    DistributedDataParallel ddp(net, comm);
    ddp.join();
  });
  for (std::size_t r = 0; r < 2; ++r) expect_error_on(errors, r, "allow_uneven_inputs()");
}

struct WideImpl : ::torch::nn::Module {
  explicit WideImpl(int width) { fc = register_module("fc", ::torch::nn::Linear(4, width)); }
  ::torch::Tensor forward(const ::torch::Tensor& x) { return fc->forward(x); }
  ::torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Wide);

TEST(DistributedDataParallelMisuse, ModelsThatDifferAcrossRanksFailOnEveryRank) {
  const auto errors = run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Wide net(rank == 0 ? 3 : 5);
    DistributedDataParallel ddp(net, comm);
  });
  expect_error_on(errors, 1, "fc.weight");
  expect_error_on(errors, 1, "differs from rank 0");
  expect_error_on(errors, 0, "another rank's model differs");
}

TEST(DistributedDataParallelMisuse, OptionsThatDifferAcrossRanksFailOnEveryRankNamingThem) {
  // One rank with private buckets, or another bucket cap, used to surface only as a
  // timeout or a size mismatch in the first backward.
  const auto errors = run_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net net = make_net(1);
    DistributedDataParallelOptions options;
    options.shared_buckets = rank == 0;
    if (rank == 1) options.limits.bucket_cap_bytes = 4 << 20;
    DistributedDataParallel ddp(net, comm, options);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    expect_error_on(errors, r, "DistributedDataParallelOptions differ");
    expect_error_on(errors, r, "shared_buckets is");
    expect_error_on(errors, r, "limits.bucket_cap_bytes is");
  }
}

struct OnMetaImpl : ::torch::nn::Module {
  OnMetaImpl() {
    weight = register_parameter(
        "weight", ::torch::empty({4}, ::torch::TensorOptions().device(::torch::kMeta)));
  }
  ::torch::Tensor weight;
};
TORCH_MODULE(OnMeta);

TEST(DistributedDataParallelMisuse, ParametersNeitherOnTheCpuNorOnCudaAreRefusedNamingTheDevice) {
  const auto errors = run_ranks(1, [&](int, std::shared_ptr<Communicator> comm) {
    OnMeta net;
    DistributedDataParallel ddp(net, comm);
  });
  expect_error_on(errors, 0, "parameter 'weight' must be a contiguous CPU or CUDA tensor");
  expect_error_on(errors, 0, "on meta");
}

}  // namespace
}  // namespace ddp_test
