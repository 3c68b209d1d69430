// braid::torch::DistributedDataParallel: PyTorch DDP's contract for a libtorch module,
// with braid's reducer underneath. The training loop does not change:
//
//   auto comm = braid::collectives::Communicator::world(*world);
//   braid::torch::DistributedDataParallel ddp(model, comm);   // broadcasts rank 0's weights
//   torch::optim::SGD opt(model->parameters(), 0.1);
//   for (auto& [x, y] : batches) {
//     opt.zero_grad(/*set_to_none=*/false);  // in place: .grad stays its bucket's view
//     auto loss = torch::mse_loss(ddp.forward(x), y);
//     loss.backward();   // buckets all-reduce while backward runs; averaged at its end
//     opt.step();
//   }
//
// How: every parameter's gradient accumulator gets a post-hook that hands the gradient
// to the reducer (dp/reducer.hpp) the moment it is final; the first hook of a backward
// queues an engine callback (Engine::queue_callback) that finalizes the reduction when
// backward ends, so backward() returns with averaged gradients. forward() runs the
// module, re-broadcasts buffers from rank 0 first (broadcast_buffers; with uneven inputs,
// from the lowest rank still training), and, with
// find_unused_parameters, walks the autograd graph from the outputs to find parameters
// this forward did not use.
//
// Construction is a collective: every rank checks its parameters (names order, shapes,
// dtypes) against rank 0's and fails, naming the first difference, if any rank differs;
// then parameters and buffers are broadcast from rank 0.
//
// Tracing: forward and backward are compute spans on the training thread; each bucket is
// a "bucket" span from full to reduced on the "ddp buckets" track, the all-reduces are
// comm spans on the communicator's track, so `braid-trace summary` reports the overlap.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <braid/collectives/communicator.hpp>
#include <braid/dp/reducer.hpp>
#include <braid/torch/data_parallel/module_outputs.hpp>
#include <braid/torch/data_parallel/no_sync.hpp>

namespace braid::torch {

struct DistributedDataParallelOptions {
  dp::BucketLimits limits;              // 1 MiB first bucket, 25 MiB after
  bool broadcast_buffers = true;        // buffers from rank 0 before every forward (uneven
                                        // inputs: from the lowest rank still training)
  bool find_unused_parameters = false;  // walk the graph after forward (costs a traversal)
  bool rebuild_buckets = true;          // once, from the first iteration's arrival order
  // .grad tensors are views into the buckets: no copies around the all-reduce. Zero in
  // place, optimizer.zero_grad(/*set_to_none=*/false) (libtorch 2's default sets none); a
  // gradient set to a new tensor falls back to copying. On by default, unlike PyTorch's
  // (docs/layers/dp.md, "Gradients live in the buckets by default"): the copies in and
  // out add to every step's exposed communication (docs/benchmarks.md has the figures),
  // and hold a second copy of every gradient. false: copy mode, where .grad tensors are
  // the framework's own.
  bool gradient_as_bucket_view = true;
  // Buckets in memory every rank on the node maps (dp::ReducerOptions::shared_buckets).
  bool shared_buckets = true;
  // The graph is the same every iteration: with find_unused_parameters, the unused set
  // found in the first iteration is reused instead of walking the graph each time.
  bool static_graph = false;
};

// What a rank leaves join() with (DistributedDataParallel::join).
struct DataParallelJoined {
  // The others' forwards this rank answered in join(), no_sync() and no-grad ones
  // included (each is one iteration to shadow).
  std::size_t shadowed_forwards = 0;
  // The rank whose parameters and buffers every rank now holds; -1 where no rank
  // shadowed anything (every rank ran the same forwards) and nothing was sent.
  int parameters_from = -1;
};

namespace detail {

class DataParallelCore;

// The half of DistributedDataParallel that does not depend on the module's type, out of
// line (src/torch/data_parallel/data_parallel_core.hpp holds it): hooks, buckets, uneven
// inputs. One out-of-line call per forward and per backward.
class DataParallelHandle {
 public:
  DataParallelHandle(::torch::nn::Module& module, std::shared_ptr<collectives::Communicator> comm,
                     DistributedDataParallelOptions options);
  ~DataParallelHandle();
  DataParallelHandle(DataParallelHandle&&) noexcept;
  DataParallelHandle& operator=(DataParallelHandle&&) noexcept;

  void before_forward();
  void after_forward(const std::vector<at::Tensor>& outputs);
  void prepare_for_backward(bool sync);
  void allow_uneven_inputs();
  DataParallelJoined join();
  dp::Reducer& reducer() noexcept;
  std::atomic<bool>& require_sync() noexcept;

 private:
  std::unique_ptr<DataParallelCore> core_;
};

}  // namespace detail

template <class ModulePointer>
class DistributedDataParallel {
 public:
  using Options = DistributedDataParallelOptions;

  // `module`: a ModuleHolder (torch::nn::Linear, TORCH_MODULE types) or a shared_ptr to a
  // torch::nn::Module subclass with a forward(). A collective call (see above).
  DistributedDataParallel(ModulePointer module, std::shared_ptr<collectives::Communicator> comm,
                          Options options = {})
      : module_(std::move(module)),
        core_(static_cast<::torch::nn::Module&>(*module_), std::move(comm), std::move(options)) {}

  template <class... Args>
  auto forward(Args&&... args) {
    core_.before_forward();
    auto output = module_->forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    detail::collect_tensors(output, tensors);
    core_.after_forward(tensors);
    return output;
  }
  template <class... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // While it lives, backward passes accumulate gradients locally without communicating;
  // the first backward after it reduces the accumulated sum (PyTorch's no_sync()).
  using NoSync = braid::torch::NoSync;
  [[nodiscard]] NoSync no_sync() { return NoSync(core_.require_sync()); }

  // For schedules that run several forwards before their backwards (pipeline parallelism,
  // torch/pipeline_executor.hpp): call the module itself for the forwards, and this before
  // each backward: `sync` for the last backward of the step, which reduces what every
  // backward since the last reduction accumulated (the buckets launching as it produces
  // them), false for the others, which accumulate locally. No buffer broadcast and no
  // unused-parameter search (find_unused_parameters is refused here).
  void prepare_for_backward(bool sync) { core_.prepare_for_backward(sync); }

  // Uneven inputs (PyTorch's DDP join()): ranks that run out of batches at different
  // times. Every rank calls allow_uneven_inputs() before its loop and join() after its
  // last batch:
  //
  //   ddp.allow_uneven_inputs();
  //   for (auto& [x, y] : my_batches) { ...forward, backward, step... }
  //   auto joined = ddp.join();
  //
  // Every rank calls allow_uneven_inputs() at the same point (it changes what each forward
  // issues). From there on, each forward starts with one small all-reduce that
  // says which ranks still train and whether they synchronise gradients this iteration
  // (ranks that disagree, one under no_sync(), fail naming it). A rank in join() answers
  // it and shadows the iterations of the ranks still training: their buffer broadcast and
  // bucket all-reduces, contributing zero gradients (error-feedback hooks add none of its
  // error and keep it), so the average divides by the whole world, as PyTorch's default
  // (divide_by_initial_world_size) does. Buffers come from the
  // lowest rank still training. When every rank has joined, and some iteration was
  // shadowed, every rank takes the parameters and buffers of the lowest rank that trained
  // to the end: every rank leaves join() with the same model. Optimizer state (momentum)
  // of a joined rank has missed the shadowed steps. A collective of your own inside the
  // loop (clip_grad_norm included) has no shadow: keep those out of uneven loops.
  void allow_uneven_inputs() { core_.allow_uneven_inputs(); }
  using Joined = DataParallelJoined;
  Joined join() { return core_.join(); }

  // PyTorch's register_comm_hook: how buckets are reduced (dp/comm_hook.hpp), e.g.
  // ddp.register_comm_hook(braid::dp::power_sgd_hook(4)).
  void register_comm_hook(std::shared_ptr<dp::CommHook> hook) {
    core_.reducer().set_comm_hook(std::move(hook));
  }
  // After backward: clips the averaged gradients to a global L2 norm (a collective).
  double clip_grad_norm(double max_norm) { return core_.reducer().clip_grad_norm(max_norm); }

  ModulePointer& module() noexcept { return module_; }
  dp::Reducer& reducer() noexcept { return core_.reducer(); }

 private:
  ModulePointer module_;
  detail::DataParallelHandle core_;
};

}  // namespace braid::torch
