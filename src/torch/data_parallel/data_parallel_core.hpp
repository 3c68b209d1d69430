// DistributedDataParallel's core: everything that does not depend on the module's type
// (distributed_data_parallel.cpp), behind detail::DataParallelHandle.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <braid/collectives/communicator.hpp>
#include <braid/dp/reducer.hpp>
#include <braid/torch/data_parallel/distributed_data_parallel.hpp>
#include <braid/trace/compute_span.hpp>

namespace braid::torch::detail {

class DataParallelCore final : public dp::GradientAccess {
 public:
  DataParallelCore(::torch::nn::Module& module, std::shared_ptr<collectives::Communicator> comm,
                   DistributedDataParallelOptions options);
  ~DataParallelCore() override;
  DataParallelCore(const DataParallelCore&) = delete;
  DataParallelCore& operator=(const DataParallelCore&) = delete;

  void before_forward();
  void after_forward(const std::vector<at::Tensor>& outputs);
  void prepare_for_backward(bool sync);
  void allow_uneven_inputs();
  DataParallelJoined join();

  std::optional<Buffer> gradient(std::size_t index, bool create) override;
  bool bind_gradient(std::size_t index, Buffer slot, std::shared_ptr<const void> owner) override;

  dp::Reducer& reducer() noexcept { return *reducer_; }
  std::atomic<bool>& require_sync() noexcept { return require_sync_; }

 private:
  void on_gradient(std::size_t index);
  void end_of_backward();
  void check_same_model();
  // CUDA parameters on `device`: routes the communicator's CUDA calls to a new NCCL
  // communicator unless some ranks share a device (or the caller routed already).
  void route_cuda(int device);
  // Every rank's options must match (bucket sizes, shared buckets, ...): one that differs
  // would otherwise surface later as a size mismatch or a timeout.
  void check_same_options();
  void broadcast_from_rank0(const std::vector<at::Tensor>& tensors);
  std::vector<std::size_t> unused_parameters(const std::vector<at::Tensor>& outputs) const;
  // Uneven inputs: what the ranks say at the start of each iteration (an all-reduce(max)
  // of four numbers, one per forward), and what that tells each of them.
  struct Notice {
    int first_active = -1;  // the lowest rank still training; -1: every rank has joined
    bool sync = false;      // the ranks still training synchronise this iteration
    bool shadowed = false;  // some joined rank has shadowed an iteration
  };
  Notice exchange_notice(bool active, bool sync, bool shadowed);
  void broadcast_buffers_from(int root);
  void broadcast_from(const std::vector<at::Tensor>& tensors, int root);

  ::torch::nn::Module& module_;
  std::shared_ptr<collectives::Communicator> comm_;
  DistributedDataParallelOptions options_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<::torch::autograd::Node>> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;
  std::unique_ptr<dp::Reducer> reducer_;
  std::atomic<bool> require_sync_{true};
  std::atomic<bool> callback_queued_{false};
  std::atomic<bool> backward_started_{false};
  std::optional<trace::ComputeSpan> forward_span_;
  std::optional<trace::ComputeSpan> backward_span_;
  std::mutex span_mutex_;
  std::optional<std::vector<std::size_t>> static_unused_;  // static_graph's first answer
  bool uneven_inputs_ = false;  // allow_uneven_inputs() until join() returns
  int last_first_active_ = -1;  // first_active of the last notice that had one
};

}  // namespace braid::torch::detail
