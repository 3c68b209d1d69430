// NcclCommunicator's entry points (nccl_communicator.hpp) and their issue order: each
// checks its call with the checks Communicator uses (call_checks.hpp) and takes a ticket at
// the call; when its turn comes, run() makes the communication stream follow the compute
// stream, enqueues the NCCL calls, waits for them to settle and passes the turn on.
#include <algorithm>
#include <cstring>

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <braid/collectives/nccl_communicator.hpp>
#include <braid/core/cuda_error.hpp>
#include <braid/core/cuda_support.hpp>
#include <braid/core/log.hpp>
#include <braid/core/nccl_error.hpp>
#include <braid/trace/cuda_timeline.hpp>
#include <braid/trace/span.hpp>

#include "collectives/call_checks.hpp"

namespace braid::collectives {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  return ncclUint8;
}

// ncclAvg divides once at the end; on integers NCCL sums and then divides with C's
// truncation, which is braid's definition of avg (communicator.hpp).
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::prod:
      return ncclProd;
    case ReduceOp::min:
      return ncclMin;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::avg:
      return ncclAvg;
  }
  return ncclSum;
}

std::byte* at(const Buffer& buffer, std::size_t elements) {
  return static_cast<std::byte*>(buffer.data()) + elements * dtype_size(buffer.dtype());
}

// The calls' checks (call_checks.hpp), shared with Communicator: the error names the world
// rank and "nccl <operation>"; buffers are CUDA memory of the communicator's device.
detail::CallSite site_of(const NcclCommunicator& comm, int world_rank) {
  return {
      .rank = comm.rank(), .size = comm.size(), .world_rank = world_rank, .communicator = "nccl"};
}

void check(const NcclCommunicator& comm, int world_rank, const detail::CollectiveCall& call) {
  detail::check_call(call, site_of(comm, world_rank), detail::device_memory(comm.device()));
}

// A rank's own block in gather/scatter: a device copy on the stream, in NCCL's terms.
ncclResult_t copy_on(cudaStream_t stream, void* dst, const void* src, std::size_t bytes) {
  if (dst == src || bytes == 0) return ncclSuccess;
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream) == cudaSuccess
             ? ncclSuccess
             : ncclUnhandledCudaError;
}

// An ncclGroupStart/End bracket: the calls between them launch as one operation (NCCL
// needs this for point-to-point patterns, or matching sends and receives deadlock).
template <class Calls>
ncclResult_t grouped(Calls calls) {
  ncclResult_t result = ncclGroupStart();
  if (result != ncclSuccess) return result;
  const ncclResult_t inside = calls();
  result = ncclGroupEnd();
  return inside != ncclSuccess && inside != ncclInProgress ? inside : result;
}

}  // namespace

// ---------------------------------------------------------------- issue order

asio::awaitable<void> NcclCommunicator::wait_turn(std::uint64_t ticket, std::string_view what,
                                                  Deadline deadline) {
  while (serving_ != ticket) {
    check_usable(what);
    asio::steady_timer timer(co_await asio::this_coro::executor, deadline);
    waiting_.push_back(&timer);
    boost::system::error_code cancelled;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, cancelled));
    std::erase(waiting_, &timer);
    if (!cancelled && serving_ != ticket) {
      const std::string why = fmt::format(
          "{} waited past its timeout for operation {} on this communicator to be issued "
          "(was an awaitable dropped without being awaited?)",
          what, serving_);
      abort(why);
      throw error(Errc::timeout, why, what);
    }
  }
}

void NcclCommunicator::pass_turn() noexcept {
  ++serving_;
  for (asio::steady_timer* waiting : waiting_) waiting->cancel();
}

cudaStream_t NcclCommunicator::producer_of(const Buffer& input, const Buffer& output) const {
  Stream* named = stream_of(input, output);
  if (named == nullptr) return compute_stream_;
  auto* cuda = dynamic_cast<CudaStream*>(named);
  if (cuda == nullptr) {
    throw error(Errc::invalid_argument,
                fmt::format("a buffer ordered on a {} stream; NCCL follows CUDA streams",
                            to_string(named->kind())),
                "nccl");
  }
  return cuda->native();
}

template <class Enqueue, class Settled>
asio::awaitable<void> NcclCommunicator::run(std::uint64_t ticket, trace::Name name,
                                            std::size_t bytes, cudaStream_t producer,
                                            Enqueue enqueue, Settled settled_calls) {
  // Operations still running hold the communicator; dropping the last handle meanwhile
  // must not free it under them.
  const std::shared_ptr<NcclCommunicator> self = shared_from_this();
  const Deadline deadline = deadline_after(timeout_);
  co_await wait_turn(ticket, name.view(), deadline);
  trace::AsyncSpan span(trace::Category::comm, name, track_, bytes);
  std::unique_ptr<CudaEvent> produced = take_event();
  std::unique_ptr<CudaEvent> done = take_event();
  {
    // From here until the calls have settled nothing else may call into NCCL on this
    // communicator (NCCL's rule for non-blocking communicators): the next ticket waits.
    struct Turn {
      NcclCommunicator& comm;
      ~Turn() { comm.pass_turn(); }
    } turn{*this};
    struct GpuSpan {
      CudaTimeline* timeline = nullptr;
      std::uint64_t token = 0;
      ~GpuSpan() {
        try {
          if (token != 0) timeline->end(token);
        } catch (const std::exception& e) {
          log::warn("ending a GPU trace span failed: {}", e.what());
        }
      }
    } gpu_span;
    check_usable(name.view());
    ncclResult_t result = ncclSuccess;
    {
      const CudaDeviceGuard guard(device_);
      // Contract point 1: the operation follows what the compute stream has enqueued.
      BRAID_CUDA_CHECK(cudaEventRecord(produced->native(), producer));
      BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream_.native(), produced->native(), 0));
      if (gpu_timeline_ != nullptr) {
        gpu_span.timeline = gpu_timeline_.get();
        gpu_span.token = gpu_timeline_->begin(trace::Category::comm, name, bytes);
      }
      result = enqueue();
    }
    // Non-blocking: the kernels may reach the stream only once the calls have settled.
    if (result == ncclInProgress) {
      co_await settle(name.view(), deadline);
    } else if (result != ncclSuccess) {
      fail(name.view(), result);
    }
    settled_calls();
  }
  stream_.record(*done);
  co_await await_done(*done, name.view(), deadline);
  give_back(std::move(produced));
  give_back(std::move(done));
}

template <class Enqueue>
asio::awaitable<void> NcclCommunicator::issue(trace::Name name, std::size_t bytes,
                                              cudaStream_t producer, Enqueue enqueue) {
  return run(next_ticket_++, name, bytes, producer, std::move(enqueue), [] {});
}

// ---------------------------------------------------------------- operations

asio::awaitable<void> NcclCommunicator::all_reduce(Buffer input, Buffer output, ReduceOp op) {
  check(*this, world_rank_,
        {.kind = CollectiveKind::all_reduce, .input = input, .output = output, .reduce_op = op});
  return issue(
      "all_reduce", input.size_bytes(), producer_of(input, output), [this, input, output, op] {
        return ncclAllReduce(input.data(), output.data(), input.count(), nccl_type(input.dtype()),
                             nccl_op(op), comm_, stream_.native());
      });
}

asio::awaitable<void> NcclCommunicator::all_reduce(Buffer data, ReduceOp op) {
  return all_reduce(data, data, op);
}

asio::awaitable<void> NcclCommunicator::reduce_scatter(Buffer input, Buffer output, ReduceOp op) {
  check(
      *this, world_rank_,
      {.kind = CollectiveKind::reduce_scatter, .input = input, .output = output, .reduce_op = op});
  return issue(
      "reduce_scatter", input.size_bytes(), producer_of(input, output), [this, input, output, op] {
        return ncclReduceScatter(input.data(), output.data(), output.count(),
                                 nccl_type(input.dtype()), nccl_op(op), comm_, stream_.native());
      });
}

asio::awaitable<void> NcclCommunicator::reduce_scatter(Buffer data, ReduceOp op) {
  const Buffer block =
      detail::rank_block(CollectiveKind::reduce_scatter, data, site_of(*this, world_rank_));
  return reduce_scatter(data, block, op);
}

asio::awaitable<void> NcclCommunicator::reduce(Buffer input, Buffer output, ReduceOp op, int root) {
  check(*this, world_rank_,
        {.kind = CollectiveKind::reduce,
         .input = input,
         .output = output,
         .reduce_op = op,
         .root = root});
  // The receive buffer matters at the root only.
  void* received = rank_ == root ? output.data() : input.data();
  return issue("reduce", input.size_bytes(), producer_of(input, output),
               [this, input, received, op, root] {
                 return ncclReduce(input.data(), received, input.count(), nccl_type(input.dtype()),
                                   nccl_op(op), root, comm_, stream_.native());
               });
}

asio::awaitable<void> NcclCommunicator::reduce(Buffer data, ReduceOp op, int root) {
  return reduce(data, data, op, root);
}

asio::awaitable<void> NcclCommunicator::all_gather(Buffer input, Buffer output) {
  check(*this, world_rank_, {.kind = CollectiveKind::all_gather, .input = input, .output = output});
  return issue("all_gather", output.size_bytes(), producer_of(input, output),
               [this, input, output] {
                 return ncclAllGather(input.data(), output.data(), input.count(),
                                      nccl_type(input.dtype()), comm_, stream_.native());
               });
}

asio::awaitable<void> NcclCommunicator::all_gather(Buffer data) {
  const Buffer block =
      detail::rank_block(CollectiveKind::all_gather, data, site_of(*this, world_rank_));
  return all_gather(block, data);
}

asio::awaitable<void> NcclCommunicator::all_gather_v(Buffer input, Buffer output,
                                                     std::span<const std::size_t> counts) {
  check(*this, world_rank_,
        {.kind = CollectiveKind::all_gather,
         .input = input,
         .output = output,
         .counts = counts,
         .variable = true});
  // One broadcast per rank's block, launched together.
  return issue("all_gather_v", output.size_bytes(), producer_of(input, output),
               [this, input, output, counts] {
                 return grouped([&] {
                   std::size_t offset = 0;
                   for (int r = 0; r < size_; ++r) {
                     const std::size_t count = counts[static_cast<std::size_t>(r)];
                     const void* source = r == rank_ ? input.data() : at(output, offset);
                     const ncclResult_t result =
                         ncclBroadcast(source, at(output, offset), count, nccl_type(input.dtype()),
                                       r, comm_, stream_.native());
                     if (result != ncclSuccess && result != ncclInProgress) return result;
                     offset += count;
                   }
                   return ncclSuccess;
                 });
               });
}

asio::awaitable<void> NcclCommunicator::broadcast(Buffer data, int root) {
  check(*this, world_rank_,
        {.kind = CollectiveKind::broadcast, .input = data, .output = data, .root = root});
  return issue("broadcast", data.size_bytes(), producer_of(data, data), [this, data, root] {
    return ncclBroadcast(data.data(), data.data(), data.count(), nccl_type(data.dtype()), root,
                         comm_, stream_.native());
  });
}

asio::awaitable<void> NcclCommunicator::gather(Buffer input, Buffer output, int root) {
  check(*this, world_rank_,
        {.kind = CollectiveKind::gather, .input = input, .output = output, .root = root});
  return issue(
      "gather", input.size_bytes() * static_cast<std::size_t>(size_), producer_of(input, output),
      [this, input, output, root] {
        return grouped([&] {
          const ncclDataType_t type = nccl_type(input.dtype());
          if (rank_ == root) {
            for (int r = 0; r < size_; ++r) {
              void* block = at(output, static_cast<std::size_t>(r) * input.count());
              const ncclResult_t result =
                  r == rank_ ? copy_on(stream_.native(), block, input.data(), input.size_bytes())
                             : ncclRecv(block, input.count(), type, r, comm_, stream_.native());
              if (result != ncclSuccess && result != ncclInProgress) return result;
            }
            return ncclSuccess;
          }
          return ncclSend(input.data(), input.count(), type, root, comm_, stream_.native());
        });
      });
}

asio::awaitable<void> NcclCommunicator::scatter(Buffer input, Buffer output, int root) {
  check(*this, world_rank_,
        {.kind = CollectiveKind::scatter, .input = input, .output = output, .root = root});
  return issue(
      "scatter", output.size_bytes() * static_cast<std::size_t>(size_), producer_of(input, output),
      [this, input, output, root] {
        return grouped([&] {
          const ncclDataType_t type = nccl_type(output.dtype());
          if (rank_ == root) {
            for (int r = 0; r < size_; ++r) {
              const void* block = at(input, static_cast<std::size_t>(r) * output.count());
              const ncclResult_t result =
                  r == rank_ ? copy_on(stream_.native(), output.data(), block, output.size_bytes())
                             : ncclSend(block, output.count(), type, r, comm_, stream_.native());
              if (result != ncclSuccess && result != ncclInProgress) return result;
            }
            return ncclSuccess;
          }
          return ncclRecv(output.data(), output.count(), type, root, comm_, stream_.native());
        });
      });
}

asio::awaitable<void> NcclCommunicator::all_to_all(Buffer input, Buffer output) {
  check(*this, world_rank_, {.kind = CollectiveKind::all_to_all, .input = input, .output = output});
  const std::size_t block = input.count() / static_cast<std::size_t>(size_);
  // In place, the blocks to send are copied aside first: NCCL would otherwise receive
  // into a block it has yet to send. The copy is freed in stream order once the calls have
  // settled, so after the kernels that read it.
  auto aside = std::make_shared<void*>(nullptr);
  const bool in_place = input.data() == output.data() && input.size_bytes() != 0;
  auto exchange = [this, input, output, block, aside, in_place] {
    const ncclDataType_t type = nccl_type(input.dtype());
    Buffer source = input;
    if (in_place) {
      if (cudaMallocAsync(aside.get(), input.size_bytes(), stream_.native()) != cudaSuccess) {
        return ncclUnhandledCudaError;
      }
      if (copy_on(stream_.native(), *aside, input.data(), input.size_bytes()) != ncclSuccess) {
        return ncclUnhandledCudaError;
      }
      source = Buffer(*aside, input.count(), input.dtype(), MemoryKind::cuda, device_);
    }
    return grouped([&] {
      for (int r = 0; r < size_; ++r) {
        const auto offset = static_cast<std::size_t>(r) * block;
        ncclResult_t sent = ncclSend(at(source, offset), block, type, r, comm_, stream_.native());
        if (sent != ncclSuccess && sent != ncclInProgress) return sent;
        ncclResult_t received =
            ncclRecv(at(output, offset), block, type, r, comm_, stream_.native());
        if (received != ncclSuccess && received != ncclInProgress) return received;
      }
      return ncclSuccess;
    });
  };
  auto free_aside = [this, aside] {
    if (*aside != nullptr) (void)cudaFreeAsync(*aside, stream_.native());
  };
  return run(next_ticket_++, "all_to_all", input.size_bytes(), producer_of(input, output),
             std::move(exchange), std::move(free_aside));
}

asio::awaitable<void> NcclCommunicator::all_to_all(Buffer data) {
  return all_to_all(data, data);
}

asio::awaitable<void> NcclCommunicator::all_to_all_v(Buffer input,
                                                     std::span<const std::size_t> send_counts,
                                                     Buffer output,
                                                     std::span<const std::size_t> recv_counts) {
  check(*this, world_rank_,
        {.kind = CollectiveKind::all_to_all,
         .input = input,
         .output = output,
         .counts = send_counts,
         .recv_counts = recv_counts,
         .variable = true});
  return issue("all_to_all_v", input.size_bytes(), producer_of(input, output),
               [this, input, output, send_counts, recv_counts] {
                 return grouped([&] {
                   const ncclDataType_t type = nccl_type(input.dtype());
                   std::size_t send_offset = 0;
                   std::size_t recv_offset = 0;
                   for (int r = 0; r < size_; ++r) {
                     const auto i = static_cast<std::size_t>(r);
                     ncclResult_t s = ncclSend(at(input, send_offset), send_counts[i], type, r,
                                               comm_, stream_.native());
                     if (s != ncclSuccess && s != ncclInProgress) return s;
                     ncclResult_t v = ncclRecv(at(output, recv_offset), recv_counts[i], type, r,
                                               comm_, stream_.native());
                     if (v != ncclSuccess && v != ncclInProgress) return v;
                     send_offset += send_counts[i];
                     recv_offset += recv_counts[i];
                   }
                   return ncclSuccess;
                 });
               });
}

asio::awaitable<void> NcclCommunicator::barrier() {
  // A one-element all-reduce: NCCL has no barrier, and this is what torch.distributed's
  // NCCL backend does too.
  return issue("barrier", 0, compute_stream_, [this] {
    return ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_,
                         stream_.native());
  });
}

asio::awaitable<void> NcclCommunicator::send(Buffer data, int peer) {
  detail::check_point_to_point("send", data, peer, site_of(*this, world_rank_),
                               detail::device_memory(device_));
  return issue("send", data.size_bytes(), producer_of(data, data), [this, data, peer] {
    return grouped([&] {
      return ncclSend(data.data(), data.count(), nccl_type(data.dtype()), peer, comm_,
                      stream_.native());
    });
  });
}

namespace {
asio::awaitable<std::size_t> counted(asio::awaitable<void> operation, std::size_t count) {
  co_await std::move(operation);
  co_return count;
}
}  // namespace

asio::awaitable<std::size_t> NcclCommunicator::recv(Buffer data, int peer) {
  detail::check_point_to_point("recv", data, peer, site_of(*this, world_rank_),
                               detail::device_memory(device_));
  auto receiving = issue("recv", data.size_bytes(), producer_of(data, data), [this, data, peer] {
    return grouped([&] {
      return ncclRecv(data.data(), data.count(), nccl_type(data.dtype()), peer, comm_,
                      stream_.native());
    });
  });
  return counted(std::move(receiving), data.count());
}

}  // namespace braid::collectives
