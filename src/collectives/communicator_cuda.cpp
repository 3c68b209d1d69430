// How Communicator moves CUDA buffers (docs/gpu.md): a call on memory of the device of the
// NCCL communicator route_cuda_to() named runs there, in NCCL's order; any other runs on
// host staging copies of its buffers (staging.hpp), all_reduce, broadcast and reduce in
// pipelined chunks, the rest whole.
#include <memory>
#include <utility>

#include <braid/build_config.hpp>
#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>

#include "collectives/collective_call.hpp"
#include "collectives/communicator_internal.hpp"
#include "collectives/staging.hpp"
#include "collectives/staging_engine_override.hpp"
#if BRAID_WITH_CUDA
#include <braid/collectives/nccl_communicator.hpp>

#include "collectives/cuda_copy_engine.hpp"
#endif

namespace braid::collectives {

using detail::CollectiveCall;

void Communicator::route_cuda_to(std::shared_ptr<NcclCommunicator> nccl) {
#if BRAID_WITH_CUDA
  BRAID_ENFORCE(nccl == nullptr || nccl->size() == size(),
                "an NCCL communicator of {} ranks cannot carry a communicator of {}",
                nccl == nullptr ? 0 : nccl->size(), size());
#endif
  state_->nccl_ = std::move(nccl);
}

bool Communicator::State::routes_to_nccl(const Buffer& buffer) const {
#if BRAID_WITH_CUDA
  return nccl_ != nullptr && buffer.memory() == MemoryKind::cuda &&
         buffer.device() == nccl_->device();
#else
  (void)buffer;
  return false;
#endif
}

asio::awaitable<void> Communicator::State::start_on_nccl(const CollectiveCall& c) {
#if BRAID_WITH_CUDA
  // The NCCL entry points take their place in NCCL's issue order now, at the call, as this
  // communicator's own calls do.
  NcclCommunicator& nccl = *nccl_;
  asio::awaitable<void> started = [&]() -> asio::awaitable<void> {
    switch (c.kind) {
      case CollectiveKind::all_reduce:
        return nccl.all_reduce(c.input, c.output, c.reduce_op);
      case CollectiveKind::reduce_scatter:
        return nccl.reduce_scatter(c.input, c.output, c.reduce_op);
      case CollectiveKind::reduce:
        return nccl.reduce(c.input, c.output, c.reduce_op, c.root);
      case CollectiveKind::all_gather:
        return c.variable ? nccl.all_gather_v(c.input, c.output, c.counts)
                          : nccl.all_gather(c.input, c.output);
      case CollectiveKind::broadcast:
        return nccl.broadcast(c.output, c.root);
      case CollectiveKind::gather:
        return nccl.gather(c.input, c.output, c.root);
      case CollectiveKind::scatter:
        return nccl.scatter(c.input, c.output, c.root);
      case CollectiveKind::all_to_all:
        return c.variable ? nccl.all_to_all_v(c.input, c.counts, c.output, c.recv_counts)
                          : nccl.all_to_all(c.input, c.output);
      case CollectiveKind::barrier:
        return nccl.barrier();
    }
    return nccl.barrier();
  }();
  return detail::holding(nccl_, std::move(started));
#else
  (void)c;
  BRAID_ENFORCE(false, "an NCCL route in a build without CUDA");
  return barrier();
#endif
}

bool Communicator::accepts_cuda_buffers() const noexcept {
  return BRAID_WITH_CUDA != 0 || static_cast<bool>(state_->staging_engine_);
}

detail::StagingResources& Communicator::State::staging_for(int device) {
  for (auto& [staged_device, resources] : staging_) {
    if (staged_device == device) return *resources;
  }
  auto resources = std::make_unique<detail::StagingResources>();
  if (staging_engine_) {
    resources->engine = staging_engine_(device);
  } else {
#if BRAID_WITH_CUDA
    resources->engine =
        std::make_unique<detail::CudaCopyEngine>(device, static_cast<cudaStream_t>(cuda_stream_));
#endif
  }
  BRAID_ENFORCE(resources->engine != nullptr, "no copy engine for CUDA device {}", device);
  resources->pool = std::make_unique<detail::StagingPool>(*resources->engine);
  staging_.emplace_back(device, std::move(resources));
  return *staging_.back().second;
}

asio::awaitable<void> Communicator::State::run_staged(std::shared_ptr<Communicator> self,
                                                      CollectiveCall call) {
  // Locals, not the parameters, are what the lambdas below capture (GCC 12 may bind a
  // coroutine lambda's reference capture of a parameter to the caller's copy).
  const std::shared_ptr<Communicator> owner = self;
  const CollectiveCall* const original = &call;
  const Buffer& on_device =
      original->input.memory() == MemoryKind::cuda ? original->input : original->output;
  detail::StagingResources& staging = staging_for(on_device.device());
  const MemberPlacement placement{.one_node = false,
                                  .grouped_nodes = hierarchy_.worth_it(),
                                  .even_nodes = hierarchy_.worth_it() && hierarchy_.uniform};
  // The same call (kind, sequence, root, counts) on host views of its buffers.
  const auto on_host = [this, original, placement](Buffer input, Buffer output, std::size_t bytes) {
    CollectiveCall host_call = *original;
    host_call.input = input;
    host_call.output = output;
    host_call.bytes = bytes;
    host_call.staged = true;
    host_call.algorithm = selection_->select(original->kind, bytes, size(), placement);
    return host_call;
  };
  const bool root = rank_ == original->root;
  switch (call.kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::broadcast:
    case CollectiveKind::reduce: {
      // Chunk k of the result needs chunk k of every input only: pipeline the chunks. They
      // run one after another under the call's sequence number; a chunk's messages match
      // their receives in order (tag.hpp), so chunks never mix.
      const bool reduce_elsewhere = call.kind == CollectiveKind::reduce && !root;
      const detail::ElementwiseStaging layout{
          .input = call.input,
          .output = reduce_elsewhere ? call.input : call.output,
          .copy_in = call.kind != CollectiveKind::broadcast || root,
          .copy_out = !reduce_elsewhere,
          .chunk_bytes = detail::staging_chunk_bytes()};
      detail::ChunkRunner run_chunk = [this, &owner, &on_host,
                                       reduce_elsewhere](Buffer chunk) -> asio::awaitable<void> {
        co_await run(owner,
                     on_host(chunk, reduce_elsewhere ? Buffer{} : chunk, chunk.size_bytes()));
      };
      co_await detail::run_elementwise_staged(*staging.engine, *staging.pool, layout,
                                              std::move(run_chunk), call.deadline);
      co_return;
    }
    default: {
      detail::WholeRunner run_whole = [this, &owner, &on_host, original](
                                          Buffer input,
                                          Buffer output) -> asio::awaitable<std::size_t> {
        co_await run(owner, on_host(input, output, original->bytes));
        co_return output.size_bytes();
      };
      co_await detail::run_whole_staged(*staging.engine, *staging.pool, call.input, call.output,
                                        std::move(run_whole), call.deadline);
      co_return;
    }
  }
}

namespace detail {

void StagingEngineOverride::install(Communicator& comm, Factory make) {
  Communicator::State::of(comm).staging_engine_ = std::move(make);
}

}  // namespace detail

}  // namespace braid::collectives
