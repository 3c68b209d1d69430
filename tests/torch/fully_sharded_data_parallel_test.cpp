// braid::torch::FullyShardedDataParallel, ranks as threads: under FULL_SHARD, SHARD_GRAD_OP
// and NO_SHARD, on 2 and 3 ranks (3 makes the padding real), with SGD and Adam, training
// ends with the parameters braid's DDP ends with from the same start and data; between
// steps no unit stays gathered (the sharded strategies), and each rank holds 1/P of each
// unit; prefetch stays within its bound; no_sync() accumulates and the next step reduces
// the sum; gradient clipping takes the whole gradient's norm; checkpoints resume training
// and move between world sizes; HYBRID_SHARD and bf16 mixed precision train as DDP does;
// tensor-parallel layers shard over the data-parallel group; under the pipeline executor a
// stage sends its input gradient before its reduction's wait; misuse is refused naming
// the unit, a forward that skips run() for a sharded unit too.
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/parallel/pipeline_schedule.hpp>
#include <braid/parallel/rank_grid.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>
#include <braid/torch/data_parallel/fully_sharded_data_parallel.hpp>
#include <braid/torch/pipeline/pipeline_executor.hpp>
#include <braid/torch/tensor_parallel/parallel_linear.hpp>
#include <braid/trace/recorder.hpp>

#include "../support/expect_error.hpp"
#include "../support/scoped_env.hpp"
#include "tp_support.hpp"

namespace fully_sharded_data_parallel_test {
namespace {

using braid::collectives::Communicator;
using braid::testing::expect_close;
using braid::testing::run_tp_ranks;
using braid::testing::seeded;
using braid::torch::ShardingStrategy;
using ::torch::Tensor;

// Three blocks (the units) and a head the root unit keeps: 5 -> 7 -> 7 -> 6 -> 2.
struct NetImpl : ::torch::nn::Module {
  NetImpl() {
    blocks.push_back(register_module("b0", ::torch::nn::Linear(5, 7)));
    blocks.push_back(register_module("b1", ::torch::nn::Linear(7, 7)));
    blocks.push_back(register_module("b2", ::torch::nn::Linear(7, 6)));
    head = register_module("head", ::torch::nn::Linear(6, 2));
    ::torch::NoGradGuard no_grad;
    int seed = 1;
    for (auto& p : parameters()) p.copy_(seeded(p.sizes().vec(), seed++) * 0.4);
  }
  // Through `fsdp` when given, else plainly.
  Tensor forward(Tensor x, braid::torch::FullyShardedDataParallel* fsdp = nullptr) {
    for (auto& block : blocks) {
      x = fsdp ? fsdp->run(*block, [&] { return ::torch::tanh(block->forward(x)); })
               : ::torch::tanh(block->forward(x));
    }
    return head->forward(x);
  }
  std::vector<::torch::nn::Linear> blocks;
  ::torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

std::unique_ptr<::torch::optim::Optimizer> optimizer(bool adam, std::vector<Tensor> p) {
  if (adam) return std::make_unique<::torch::optim::Adam>(p, ::torch::optim::AdamOptions(1e-2));
  return std::make_unique<::torch::optim::SGD>(p, ::torch::optim::SGDOptions(0.1).momentum(0.9));
}

class Strategies : public ::testing::TestWithParam<std::tuple<ShardingStrategy, int, bool>> {};

TEST_P(Strategies, EndWithTheParametersOfDataParallel) {
  const auto [strategy, ranks, adam] = GetParam();
  run_tp_ranks(ranks, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net reference, sharded;
    braid::torch::DistributedDataParallel ddp(reference, comm);
    auto reference_optimizer = optimizer(adam, reference->parameters());
    braid::torch::FullyShardedDataParallel fsdp(comm, {.strategy = strategy});
    for (auto& block : sharded->blocks) fsdp.shard(*block);
    fsdp.shard(*sharded);
    auto sharded_optimizer = optimizer(adam, fsdp.parameters());
    for (int step = 0; step < 4; ++step) {
      const Tensor x = seeded({3, 5}, 100 * step + rank);
      const Tensor y = seeded({3, 2}, 100 * step + rank + 50);
      reference_optimizer->zero_grad();
      ::torch::mse_loss(ddp.forward(x), y).backward();
      reference_optimizer->step();
      sharded_optimizer->zero_grad();
      const Tensor out = fsdp.run(*sharded, [&] { return sharded->forward(x, &fsdp); });
      ::torch::mse_loss(out, y).backward();
      sharded_optimizer->step();
      if (strategy != ShardingStrategy::no_shard) {
        EXPECT_EQ(fsdp.gathered_bytes(), 0) << "a unit stayed gathered after step " << step;
      }
    }
    // The whole parameters, gathered once more through a forward without grad.
    {
      ::torch::NoGradGuard no_grad;
      const Tensor x = seeded({3, 5}, 999);
      const Tensor expected = reference->forward(x);
      const Tensor got = fsdp.run(*sharded, [&] { return sharded->forward(x, &fsdp); });
      expect_close(got, expected, fmt::format("rank {} output after training", rank), 1e-5);
    }
    const auto sizes = fsdp.unit_sizes();
    ASSERT_EQ(sizes.size(), 4u);
    for (std::size_t u = 0; u < sizes.size(); ++u) {
      const std::int64_t per_rank = (sizes[u] + ranks - 1) / ranks;
      EXPECT_EQ(fsdp.shard_size(u),
                strategy == ShardingStrategy::no_shard ? per_rank * ranks : per_rank);
    }
  });
}

std::string case_name(const ::testing::TestParamInfo<Strategies::ParamType>& info) {
  static const std::vector<std::string> names{"full_shard", "shard_grad_op", "no_shard"};
  return fmt::format("{}_ranks{}_{}", names[static_cast<std::size_t>(std::get<0>(info.param))],
                     std::get<1>(info.param), std::get<2>(info.param) ? "adam" : "sgd");
}

INSTANTIATE_TEST_SUITE_P(All, Strategies,
                         ::testing::Combine(::testing::Values(ShardingStrategy::full_shard,
                                                              ShardingStrategy::shard_grad_op,
                                                              ShardingStrategy::no_shard),
                                            ::testing::Values(2, 3), ::testing::Bool()),
                         case_name);

// DDP's reference and an FSDP twin of the same model, trained side by side: `train` runs
// one step of each on the same data.
struct Twins {
  Twins(std::shared_ptr<Communicator> comm, braid::torch::FullyShardedDataParallelOptions options,
        bool adam = true)
      : ddp(reference, comm), fsdp(comm, options) {
    reference_optimizer = optimizer(adam, reference->parameters());
    for (std::size_t b = 0; b < sharded->blocks.size(); ++b) {
      fsdp.shard(*sharded->blocks[b], fmt::format("b{}", b));
    }
    fsdp.shard(*sharded, "root");
    sharded_optimizer = optimizer(adam, fsdp.parameters());
  }
  Tensor sharded_forward(const Tensor& x) {
    return fsdp.run(*sharded, [&] { return sharded->forward(x, &fsdp); });
  }
  void step(int rank, int step) {
    const Tensor x = seeded({3, 5}, 100 * step + rank);
    const Tensor y = seeded({3, 2}, 100 * step + rank + 50);
    reference_optimizer->zero_grad();
    ::torch::mse_loss(ddp.forward(x), y).backward();
    reference_optimizer->step();
    sharded_optimizer->zero_grad();
    ::torch::mse_loss(sharded_forward(x), y).backward();
    sharded_optimizer->step();
  }
  void expect_same_outputs(const std::string& where) {
    ::torch::NoGradGuard no_grad;
    const Tensor x = seeded({3, 5}, 999);
    expect_close(sharded_forward(x), reference->forward(x), where, 1e-5);
  }
  Net reference, sharded;
  braid::torch::DistributedDataParallel<Net> ddp;
  braid::torch::FullyShardedDataParallel fsdp;
  std::unique_ptr<::torch::optim::Optimizer> reference_optimizer, sharded_optimizer;
};

// With prefetch 1, from the second step each unit's forward starts the next unit's gather:
// the trace's count of gathered units never passes the root, the running unit and one
// ahead, and the units ran in the model's order.
TEST(FullyShardedDataParallel, PrefetchesOneUnitAheadWithinItsBound) {
  const braid::testing::ScopedEnv every_call("BRAID_TRACE_SAMPLE_KIB", "0");
  braid::trace::clear();
  braid::trace::set_enabled(true);
  run_tp_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Twins twins(comm, {.prefetch = 1});
    for (int step = 0; step < 3; ++step) twins.step(rank, step);
    EXPECT_EQ(twins.fsdp.forward_order(), (std::vector<std::string>{"root", "b0", "b1", "b2"}));
    twins.expect_same_outputs(fmt::format("rank {} after prefetched steps", rank));
  });
  braid::trace::set_enabled(false);
  std::int64_t most = 0;
  int samples = 0;
  for (const auto& r : braid::trace::snapshot().records) {
    if (std::string_view(r.name) == "fsdp gathered units") {
      most = std::max(most, r.args[0].value);
      ++samples;
    }
  }
  EXPECT_GT(samples, 0);
  EXPECT_LE(most, 3) << "root, the running unit and one prefetched";
  EXPECT_GE(most, 3)
      << "the prefetch should have had the next unit gathered beside the running one";
  // The order, on each rank's thread: in the last step, block k+1's gather starts before
  // block k's forward ends (forward order), and block k's before block k+1's backward ends
  // (the reverse order). Without the prefetch each would start when its own unit runs.
  std::map<std::uint32_t, std::vector<const braid::trace::Record*>> by_track;
  const braid::trace::Snapshot snapshot = braid::trace::snapshot();
  for (const auto& r : snapshot.records) by_track[r.track].push_back(&r);
  int ranks_checked = 0;
  for (const auto& [track, records] : by_track) {
    // The last training step ends with the last backward (forwards without gradients, the
    // twins' output checks, follow it).
    std::int64_t training_end = 0;
    for (const auto* r : records) {
      if (std::string_view(r->name) == "fsdp.backward")
        training_end = std::max(training_end, r->end_ns);
    }
    // The last span of each kind and unit in training, and each unit's gather starts.
    std::map<std::pair<std::string, std::int64_t>, const braid::trace::Record*> last_span;
    std::map<std::string, std::vector<std::int64_t>> gathers;
    for (const auto* r : records) {
      const std::string_view name(r->name);
      if (r->begin_ns > training_end) continue;
      if (name == "fsdp.forward" || name == "fsdp.backward") {
        last_span[{std::string(name), r->args[0].value}] = r;
      } else if (name.starts_with("fsdp.gather ")) {
        gathers[std::string(name.substr(12))].push_back(r->begin_ns);
      }
    }
    if (last_span.empty()) continue;
    ++ranks_checked;
    // The last gather of `unit` that started before `time`.
    auto gather_before = [&](const std::string& unit, std::int64_t time) {
      std::int64_t found = -1;
      for (std::int64_t t : gathers[unit]) {
        if (t <= time) found = t;
      }
      return found;
    };
    for (std::int64_t k = 0; k < 2; ++k) {
      const auto* forward = last_span.at({"fsdp.forward", k});
      const auto* next_forward = last_span.at({"fsdp.forward", k + 1});
      const std::int64_t started = gather_before(fmt::format("b{}", k + 1), next_forward->begin_ns);
      EXPECT_GE(started, 0) << "no gather of b" << k + 1 << " before its forward";
      EXPECT_LT(started, forward->end_ns)
          << "b" << k + 1 << "'s gather should start before b" << k << "'s forward ends";
      const auto* backward = last_span.at({"fsdp.backward", k + 1});
      const auto* previous_backward = last_span.at({"fsdp.backward", k});
      const std::int64_t started_back =
          gather_before(fmt::format("b{}", k), previous_backward->begin_ns);
      EXPECT_GT(started_back, forward->end_ns) << "b" << k << " gathered again for backward";
      EXPECT_LT(started_back, backward->end_ns)
          << "b" << k << "'s gather should start before b" << k + 1 << "'s backward ends";
    }
  }
  EXPECT_EQ(ranks_checked, 2);
}

TEST(FullyShardedDataParallel, ShardsBySizeAndTrainsAsOneProcess) {
  // b0 42 parameters, b1 56, b2 48, head 14: at 45 or more, b1 and b2 become units and the
  // root takes b0 and the head.
  std::map<std::string, Tensor> trained;
  run_tp_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net net;
    braid::torch::FullyShardedDataParallel fsdp(comm);
    EXPECT_EQ(fsdp.shard_by_size(*net, 45), (std::vector<std::string>{"b1", "b2", "root"}));
    EXPECT_TRUE(fsdp.is_unit(*net->blocks[1]));
    EXPECT_FALSE(fsdp.is_unit(*net->blocks[0]));
    ::torch::optim::SGD optimizer(fsdp.parameters(), ::torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      Tensor x = seeded({3, 5}, 100 * step + rank);
      const Tensor y = seeded({3, 2}, 100 * step + rank + 50);
      optimizer.zero_grad();
      const Tensor out = fsdp.run(*net, [&] {
        for (auto& block : net->blocks) {
          x = fsdp.run_if_unit(*block, [&] { return ::torch::tanh(block->forward(x)); });
        }
        return net->head->forward(x);
      });
      ::torch::mse_loss(out, y).backward();
      optimizer.step();
    }
    const auto state = fsdp.full_state_dict(*net);
    if (rank == 0) trained = state;
  });
  // One process on both ranks' batches together.
  Net whole;
  ::torch::optim::SGD optimizer(whole->parameters(), ::torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 3; ++step) {
    const Tensor x = ::torch::cat({seeded({3, 5}, 100 * step), seeded({3, 5}, 100 * step + 1)});
    const Tensor y =
        ::torch::cat({seeded({3, 2}, 100 * step + 50), seeded({3, 2}, 100 * step + 51)});
    optimizer.zero_grad();
    ::torch::mse_loss(whole->forward(x), y).backward();
    optimizer.step();
  }
  for (const auto& named : whole->named_parameters()) {
    ASSERT_EQ(trained.count(named.key()), 1u) << named.key();
    expect_close(trained.at(named.key()), named.value(), named.key(), 1e-5);
  }
}

TEST(FullyShardedDataParallel, NoSyncAccumulatesThenReducesTheSum) {
  run_tp_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Twins twins(comm, {});
    for (int step = 0; step < 2; ++step) {
      twins.reference_optimizer->zero_grad();
      twins.sharded_optimizer->zero_grad();
      for (int micro = 0; micro < 3; ++micro) {
        const Tensor x = seeded({3, 5}, 10 * step + micro + 100 * rank);
        const Tensor y = seeded({3, 2}, 10 * step + micro + 100 * rank + 50);
        if (micro < 2) {
          auto a = twins.ddp.no_sync();
          auto b = twins.fsdp.no_sync();
          ::torch::mse_loss(twins.ddp.forward(x), y).backward();
          ::torch::mse_loss(twins.sharded_forward(x), y).backward();
        } else {
          ::torch::mse_loss(twins.ddp.forward(x), y).backward();
          ::torch::mse_loss(twins.sharded_forward(x), y).backward();
        }
      }
      twins.reference_optimizer->step();
      twins.sharded_optimizer->step();
    }
    twins.expect_same_outputs(fmt::format("rank {} after accumulated steps", rank));
  });
}

TEST(FullyShardedDataParallel, ClipsTheWholeGradientsNorm) {
  run_tp_ranks(3, [&](int rank, std::shared_ptr<Communicator> comm) {
    Twins twins(comm, {}, /*adam=*/false);
    for (int step = 0; step < 3; ++step) {
      const Tensor x = seeded({3, 5}, 100 * step + rank) * 5;
      const Tensor y = seeded({3, 2}, 100 * step + rank + 50);
      twins.reference_optimizer->zero_grad();
      ::torch::mse_loss(twins.ddp.forward(x), y).backward();
      const double reference_norm = twins.ddp.clip_grad_norm(0.05);
      twins.reference_optimizer->step();
      twins.sharded_optimizer->zero_grad();
      ::torch::mse_loss(twins.sharded_forward(x), y).backward();
      EXPECT_NEAR(twins.fsdp.clip_grad_norm(0.05), reference_norm, 1e-5 * reference_norm);
      twins.sharded_optimizer->step();
    }
    twins.expect_same_outputs(fmt::format("rank {} after clipped steps", rank));
  });
}

// Checkpoints: the full state dict is DDP's model on rank 0; a sharded save, loaded into a
// fresh model (with the optimizer's state, saved per rank), trains on as the original; a
// full state dict from 2 ranks loads on 3.
TEST(FullyShardedDataParallel, CheckpointsResumeAndMoveBetweenWorldSizes) {
  const std::string directory = fmt::format(
      "{}/braid_fsdp_checkpoint_{}", std::filesystem::temp_directory_path().string(), ::getpid());
  std::map<std::string, Tensor> saved_on_two;
  run_tp_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Twins twins(comm, {});
    for (int step = 0; step < 2; ++step) twins.step(rank, step);
    const auto state = twins.fsdp.full_state_dict(*twins.sharded);
    if (rank == 0) {
      for (const auto& named : twins.reference->named_parameters()) {
        ASSERT_EQ(state.count(named.key()), 1u) << named.key();
        expect_close(state.at(named.key()), named.value(), "state dict " + named.key(), 1e-6);
      }
      saved_on_two = state;
    } else {
      EXPECT_TRUE(state.empty());
    }
    twins.fsdp.save_sharded(directory);
    ::torch::save(*twins.sharded_optimizer, fmt::format("{}/optimizer-{}.pt", directory, rank));
    // A fresh model from the sharded checkpoint trains on exactly as the original.
    Net fresh;
    braid::torch::FullyShardedDataParallel fsdp(comm);
    for (auto& block : fresh->blocks) fsdp.shard(*block);
    fsdp.shard(*fresh);
    fsdp.load_sharded(directory);
    auto fresh_optimizer = optimizer(true, fsdp.parameters());
    ::torch::load(*fresh_optimizer, fmt::format("{}/optimizer-{}.pt", directory, rank));
    for (int step = 2; step < 4; ++step) {
      twins.step(rank, step);
      const Tensor x = seeded({3, 5}, 100 * step + rank);
      const Tensor y = seeded({3, 2}, 100 * step + rank + 50);
      fresh_optimizer->zero_grad();
      ::torch::mse_loss(fsdp.run(*fresh, [&] { return fresh->forward(x, &fsdp); }), y).backward();
      fresh_optimizer->step();
    }
    ::torch::NoGradGuard no_grad;
    const Tensor probe = seeded({3, 5}, 999);
    expect_close(fsdp.run(*fresh, [&] { return fresh->forward(probe, &fsdp); }),
                 twins.sharded_forward(probe), fmt::format("rank {} resumed", rank), 1e-6);
  });
  std::filesystem::remove_all(directory);
  // Rank 0's dict, read on every rank of 3 (as from one file).
  run_tp_ranks(3, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net model;
    braid::torch::FullyShardedDataParallel fsdp(comm);
    for (auto& block : model->blocks) fsdp.shard(*block);
    fsdp.shard(*model);
    fsdp.load_full_state_dict(*model, saved_on_two);
    Net plain;
    {
      ::torch::NoGradGuard no_grad;
      for (auto& named : plain->named_parameters())
        named.value().copy_(saved_on_two.at(named.key()));
    }
    ::torch::NoGradGuard no_grad;
    const Tensor probe = seeded({3, 5}, 999);
    expect_close(fsdp.run(*model, [&] { return model->forward(probe, &fsdp); }),
                 plain->forward(probe), fmt::format("rank {} of 3 from 2 ranks' dict", rank), 1e-6);
  });
}

// HYBRID_SHARD on two pretend nodes of two ranks: sharded inside each, replicated across.
TEST(FullyShardedDataParallel, HybridShardTrainsAsDataParallel) {
  run_tp_ranks(4,
               [&](int rank, std::shared_ptr<Communicator> comm) {
                 Twins twins(comm, {.strategy = ShardingStrategy::hybrid_shard});
                 EXPECT_EQ(twins.fsdp.shard_size(0), (35 + 7 + 1) / 2)
                     << "sharded over a node's 2 ranks";
                 for (int step = 0; step < 3; ++step) twins.step(rank, step);
                 twins.expect_same_outputs(fmt::format("rank {} hybrid", rank));
               },
               {0, 0, 1, 1});
}

// HYBRID_SHARD and FULL_SHARD of the same model on two pretend nodes of two ranks, trained
// on the same data with Adam, end with the same parameters: sharding inside a node and
// replicating across changes where the bytes go, not what is learned.
TEST(FullyShardedDataParallel, HybridShardEndsWithTheParametersOfFullShard) {
  run_tp_ranks(4,
               [&](int rank, std::shared_ptr<Communicator> comm) {
                 Net hybrid_net, full_net;
                 braid::torch::FullyShardedDataParallel hybrid(
                     comm, {.strategy = ShardingStrategy::hybrid_shard});
                 braid::torch::FullyShardedDataParallel full(
                     comm, {.strategy = ShardingStrategy::full_shard});
                 for (std::size_t b = 0; b < hybrid_net->blocks.size(); ++b) {
                   hybrid.shard(*hybrid_net->blocks[b], fmt::format("b{}", b));
                   full.shard(*full_net->blocks[b], fmt::format("b{}", b));
                 }
                 hybrid.shard(*hybrid_net, "root");
                 full.shard(*full_net, "root");
                 EXPECT_EQ(hybrid.shard_size(0), (35 + 7 + 1) / 2)
                     << "sharded over a node's 2 ranks";
                 EXPECT_EQ(full.shard_size(0), (35 + 7 + 3) / 4) << "sharded over all 4 ranks";
                 auto hybrid_optimizer = optimizer(true, hybrid.parameters());
                 auto full_optimizer = optimizer(true, full.parameters());
                 for (int step = 0; step < 4; ++step) {
                   const Tensor x = seeded({3, 5}, 100 * step + rank);
                   const Tensor y = seeded({3, 2}, 100 * step + rank + 50);
                   auto train = [&](braid::torch::FullyShardedDataParallel& fsdp, Net& net,
                                    ::torch::optim::Optimizer& opt) {
                     opt.zero_grad();
                     const Tensor out = fsdp.run(*net, [&] { return net->forward(x, &fsdp); });
                     ::torch::mse_loss(out, y).backward();
                     opt.step();
                   };
                   train(hybrid, hybrid_net, *hybrid_optimizer);
                   train(full, full_net, *full_optimizer);
                 }
                 const auto hybrid_state = hybrid.full_state_dict(*hybrid_net);
                 const auto full_state = full.full_state_dict(*full_net);
                 ASSERT_EQ(hybrid_state.size(), full_state.size());
                 for (const auto& [name, value] : full_state) {
                   ASSERT_TRUE(hybrid_state.count(name)) << name;
                   expect_close(hybrid_state.at(name), value,
                                fmt::format("rank {} parameter {}", rank, name), 1e-5);
                 }
               },
               {0, 0, 1, 1});
}

// bf16 gathers and reductions over f32 master shards: close to DDP in f32, within bf16's
// precision.
TEST(FullyShardedDataParallel, MixedPrecisionKeepsF32MastersNearDataParallel) {
  run_tp_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    Net reference, sharded;
    braid::torch::DistributedDataParallel ddp(reference, comm);
    auto reference_optimizer = optimizer(false, reference->parameters());
    braid::torch::FullyShardedDataParallel fsdp(
        comm, {.mixed_precision = braid::torch::MixedPrecision{}});
    for (auto& block : sharded->blocks) fsdp.shard(*block);
    fsdp.shard(*sharded);
    for (const Tensor& shard : fsdp.parameters()) EXPECT_EQ(shard.scalar_type(), ::torch::kFloat);
    auto sharded_optimizer = optimizer(false, fsdp.parameters());
    for (int step = 0; step < 3; ++step) {
      const Tensor x = seeded({3, 5}, 100 * step + rank);
      const Tensor y = seeded({3, 2}, 100 * step + rank + 50);
      reference_optimizer->zero_grad();
      ::torch::mse_loss(ddp.forward(x), y).backward();
      reference_optimizer->step();
      sharded_optimizer->zero_grad();
      const Tensor out =
          fsdp.run(*sharded, [&] { return sharded->forward(x.to(::torch::kBFloat16), &fsdp); });
      ::torch::mse_loss(out.to(::torch::kFloat), y).backward();
      sharded_optimizer->step();
    }
    ::torch::NoGradGuard no_grad;
    const Tensor probe = seeded({3, 5}, 999);
    const Tensor got =
        fsdp.run(*sharded, [&] { return sharded->forward(probe.to(::torch::kBFloat16), &fsdp); });
    EXPECT_EQ(got.scalar_type(), ::torch::kBFloat16);
    EXPECT_TRUE(::torch::allclose(got.to(::torch::kFloat), reference->forward(probe), 5e-2, 5e-2))
        << "rank " << rank << ": largest difference "
        << (got.to(::torch::kFloat) - reference->forward(probe)).abs().max().item<double>();
  });
}

// Under the pipeline executor (pp 2 x dp 2, 1F1B over 4 microbatches), a stage sharded over
// its data-parallel group trains as the same stage under DDP: the executor's
// prepare_backward switches the gradient sync, so only each step's last backward reduces.
class UnderThePipeline : public ::testing::TestWithParam<ShardingStrategy> {};

TEST_P(UnderThePipeline, AShardedStageTrainsAsUnderDataParallel) {
  const ShardingStrategy strategy = GetParam();
  run_tp_ranks(4, [&](int rank, std::shared_ptr<Communicator> comm) {
    auto grid = comm->launch(braid::parallel::RankGrid::create(comm, {.dp = 2, .pp = 2})).get();
    auto dp = comm->launch(grid->group(braid::parallel::Axis::dp)).get();
    auto pp = comm->launch(grid->group(braid::parallel::Axis::pp)).get();
    const int stage = grid->stage();
    const auto schedule =
        braid::parallel::lower(braid::parallel::one_f_one_b(2, 4), {.reduce_grad = true});
    const auto make = [&] {
      ::torch::nn::Linear layer(6, 6);
      ::torch::NoGradGuard no_grad;
      layer->weight.copy_(seeded({6, 6}, 10 + stage) * 0.5);
      layer->bias.copy_(seeded({6}, 20 + stage) * 0.1);
      return layer;
    };
    const auto compute = [&](const Tensor& h, int mb, auto&& layer_forward) {
      const Tensor x =
          stage == 0 ? seeded({2, 6}, 300 + mb + 10 * grid->coordinate(braid::parallel::Axis::dp))
                     : h;
      const Tensor y = ::torch::tanh(layer_forward(x));
      return stage == 1 ? y.square().sum() / 4 : y;
    };
    // DDP: the reference.
    auto reference = make();
    braid::torch::DistributedDataParallel ddp(reference, dp);
    ::torch::optim::SGD reference_optimizer(reference->parameters(), 0.1);
    braid::torch::PipelineExecutor reference_pipeline(
        pp, schedule,
        {{.stage = stage,
          .forward =
              [&](const Tensor& h, int mb) {
                return compute(h, mb, [&](const Tensor& x) { return reference->forward(x); });
              },
          .parameters = reference->parameters(),
          .prepare_backward = [&](bool sync) { ddp.prepare_for_backward(sync); }}},
        {.activation_shape = {2, 6}});
    // FSDP over the same dp group.
    auto sharded = make();
    braid::torch::FullyShardedDataParallel fsdp(dp, {.strategy = strategy});
    fsdp.shard(*sharded, fmt::format("stage{}", stage));
    ::torch::optim::SGD sharded_optimizer(fsdp.parameters(), 0.1);
    braid::torch::PipelineExecutor sharded_pipeline(
        pp, schedule,
        {{.stage = stage,
          .forward =
              [&](const Tensor& h, int mb) {
                return compute(h, mb, [&](const Tensor& x) {
                  return fsdp.run(*sharded, [&] { return sharded->forward(x); });
                });
              },
          .parameters = sharded->parameters(),
          .prepare_backward = [&](bool sync) { fsdp.set_gradient_sync(sync); }}},
        {.activation_shape = {2, 6}});
    for (int step = 0; step < 3; ++step) {
      reference_optimizer.zero_grad();
      reference_pipeline.run();
      reference_optimizer.step();
      comm->launch(comm->barrier()).get();  // one pipeline's transfers at a time
      sharded_optimizer.zero_grad();
      sharded_pipeline.run();
      sharded_optimizer.step();
      comm->launch(comm->barrier()).get();
      // Stage 1's reducing backward sent its input gradient before waiting for the reduction.
      EXPECT_EQ(sharded_pipeline.last_step().gradients_sent_early, stage == 1 ? 1 : 0);
      EXPECT_EQ(reference_pipeline.last_step().gradients_sent_early, stage == 1 ? 1 : 0);
    }
    ::torch::NoGradGuard no_grad;
    const Tensor probe = seeded({2, 6}, 999);
    expect_close(fsdp.run(*sharded, [&] { return sharded->forward(probe); }),
                 reference->forward(probe), fmt::format("rank {} stage {}", rank, stage), 1e-5);
  });
}

INSTANTIATE_TEST_SUITE_P(Strategies, UnderThePipeline,
                         ::testing::Values(ShardingStrategy::full_shard,
                                           ShardingStrategy::shard_grad_op),
                         [](const auto& info) {
                           return std::string(info.param == ShardingStrategy::full_shard
                                                  ? "full_shard"
                                                  : "shard_grad_op");
                         });

// With tensor parallelism (tp 2 x dp 2): the TP layers' local slices sharded over the
// data-parallel group train as the same layers under DDP over that group.
TEST(FullyShardedDataParallel, ShardsTensorParallelLayersOverTheDataParallelGroup) {
  run_tp_ranks(4, [&](int rank, std::shared_ptr<Communicator> comm) {
    auto grid = comm->launch(braid::parallel::RankGrid::create(comm, {.tp = 2, .dp = 2})).get();
    auto tp = comm->launch(grid->group(braid::parallel::Axis::tp)).get();
    auto dp = comm->launch(grid->group(braid::parallel::Axis::dp)).get();
    const int replica = grid->coordinate(braid::parallel::Axis::dp);
    struct Model {
      braid::torch::ColumnParallelLinear fc1;
      braid::torch::RowParallelLinear fc2;
    };
    auto make = [&] {
      return Model{
          braid::torch::ColumnParallelLinear(tp,
                                             braid::torch::ColumnParallelLinearOptions{
                                                 .in_features = 6, .out_features = 8, .seed = 41}),
          braid::torch::RowParallelLinear(tp,
                                          braid::torch::RowParallelLinearOptions{
                                              .in_features = 8, .out_features = 4, .seed = 42})};
    };
    Model reference = make();
    ::torch::nn::Sequential both(reference.fc1, reference.fc2);
    braid::torch::DistributedDataParallel ddp(both.ptr(), dp);
    ::torch::optim::SGD reference_optimizer(both->parameters(), 0.1);
    Model sharded = make();
    braid::torch::FullyShardedDataParallel fsdp(dp);  // FULL_SHARD
    fsdp.shard(*sharded.fc1, "fc1");
    fsdp.shard(*sharded.fc2, "fc2");
    ::torch::optim::SGD sharded_optimizer(fsdp.parameters(), 0.1);
    auto sharded_forward = [&](const Tensor& x) {
      const Tensor h = fsdp.run(*sharded.fc1, [&] { return sharded.fc1->forward(x); });
      return fsdp.run(*sharded.fc2, [&] { return sharded.fc2->forward(h); });
    };
    for (int step = 0; step < 3; ++step) {
      // The tp ranks of one replica share its batch; replicas differ.
      const Tensor x = seeded({3, 6}, 500 + 10 * step + replica);
      const Tensor y = seeded({3, 4}, 600 + 10 * step + replica);
      reference_optimizer.zero_grad();
      ::torch::mse_loss(ddp.forward(x), y).backward();
      reference_optimizer.step();
      sharded_optimizer.zero_grad();
      ::torch::mse_loss(sharded_forward(x), y).backward();
      sharded_optimizer.step();
    }
    ::torch::NoGradGuard no_grad;
    const Tensor probe = seeded({2, 6}, 998);
    expect_close(sharded_forward(probe), both->forward(probe),
                 fmt::format("rank {} after 3 steps", rank), 1e-5);
  });
}

TEST(FullyShardedDataParallel, RefusesMisuseNamingTheUnit) {
  run_tp_ranks(2, [&](int, std::shared_ptr<Communicator> comm) {
    Net net;
    braid::torch::FullyShardedDataParallel fsdp(comm);
    fsdp.shard(*net->blocks[0]);
    braid::testing::expect_invalid_argument([&] { fsdp.shard(*net->blocks[0]); },
                                            "has no parameters that an earlier unit did not take");
    braid::testing::expect_invalid_argument(
        [&] { fsdp.run(*net->blocks[1], [&] { return Tensor(); }); }, "which is not a unit");
  });
  // A forward that calls a sharded unit's module directly, not through run(): the error
  // names the units that were sharded and how to run them.
  run_tp_ranks(2, [&](int, std::shared_ptr<Communicator> comm) {
    Net net;
    braid::torch::FullyShardedDataParallel fsdp(comm);
    for (std::size_t b = 0; b < net->blocks.size(); ++b) {
      fsdp.shard(*net->blocks[b], fmt::format("block {}", b));
    }
    fsdp.shard(*net, "root");
    const Tensor x = seeded({4, 5}, 9);
    braid::testing::expect_invalid_argument(
        [&] { fsdp.run(*net, [&] { return net->forward(x); }); },
        "libtorch failed inside run() of unit 'root' while 'block 0', 'block 1', 'block 2' were "
        "sharded");
    EXPECT_EQ(fsdp.gathered_bytes(), 0) << "the failed forward left its unit gathered";
    // Through run() the same model trains.
    const Tensor y = fsdp.run(*net, [&] { return net->forward(x, &fsdp); });
    EXPECT_EQ(y.sizes(), (std::vector<std::int64_t>{4, 2}));
  });
  // A genuine libtorch error inside a nested run(), while no other unit is sharded, comes
  // through both runs as libtorch's own, and leaves nothing gathered.
  run_tp_ranks(2, [&](int, std::shared_ptr<Communicator> comm) {
    Net net;
    braid::torch::FullyShardedDataParallel fsdp(comm);
    fsdp.shard(*net->blocks[0], "block 0");
    fsdp.shard(*net, "root");
    const Tensor wrong = seeded({4, 3}, 9);  // block 0 takes 5 features
    try {
      fsdp.run(*net, [&] {
        return fsdp.run(*net->blocks[0], [&] { return net->blocks[0]->forward(wrong); });
      });
      ADD_FAILURE() << "a forward with the wrong shape ran";
    } catch (const braid::Error& e) {
      ADD_FAILURE() << "libtorch's error was relabelled: " << e.what();
    } catch (const c10::Error&) {
    }
    EXPECT_EQ(fsdp.gathered_bytes(), 0);
  });
  // Ranks whose units differ fail together, naming the unit.
  run_tp_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
    ::torch::nn::Linear layer(3, rank == 0 ? 2 : 4);
    braid::torch::FullyShardedDataParallel fsdp(comm);
    braid::testing::expect_invalid_argument([&] { fsdp.shard(*layer, "head"); },
                                            "the ranks' unit head differs");
  });
}

}  // namespace
}  // namespace fully_sharded_data_parallel_test
