// Communicator::send and recv (communicator.hpp): matched per pair of ranks in call order,
// on per-pair, per-direction sequence numbers and a reserved tag step, so they never
// disturb the collectives' order. CUDA memory goes to the NCCL communicator where
// route_cuda_to() says so, to UCX directly where UCX moves it, and through host staging
// copies otherwise.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>

#include <fmt/format.h>

#include <braid/build_config.hpp>
#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>
#include <braid/transport/world.hpp>

#include "collectives/call_checks.hpp"
#include "collectives/collective_op.hpp"
#include "collectives/communicator_internal.hpp"
#include "collectives/staging.hpp"
#if BRAID_WITH_CUDA
#include <braid/collectives/nccl_communicator.hpp>
#endif

namespace braid::collectives {

using detail::CollectiveOp;
using detail::memory_rule_of;
using detail::Message;
using detail::site_of;

namespace {

asio::awaitable<void> discard_count(asio::awaitable<std::size_t> operation) {
  co_await std::move(operation);
}

[[maybe_unused]] asio::awaitable<std::size_t> counted(asio::awaitable<void> operation,
                                                      std::size_t count) {
  co_await std::move(operation);
  co_return count;
}

}  // namespace

asio::awaitable<std::size_t> Communicator::State::run_point_to_point(
    std::shared_ptr<Communicator> self, std::unique_ptr<CollectiveOp> op, bool sending, Buffer data,
    int peer) {
  // In flight like a collective: a peer that fails, or leaves without the matching call,
  // aborts it.
  op->set_point_to_point({.peer = peer, .sending = sending});
  in_flight_.push_back(op.get());
  std::exception_ptr failure;
  std::size_t bytes = 0;
  try {
    abort_if_unreachable(*op);
    Message message = sending ? op->send_reserved(peer, data, detail::kPointToPointStep)
                              : op->recv_reserved(peer, data, detail::kPointToPointStep, false);
    bytes = co_await op->wait(message);
  } catch (const Error& error) {
    ErrorContext context{.rank = op->world_rank(op->rank()),
                         .peer = op->world_rank(peer),
                         .operation = sending ? "send" : "recv",
                         .sequence = op->sequence()};
    failure = std::make_exception_ptr(Error(error.code(), error.detail(), std::move(context)));
  }
  if (failure) co_await op->settle(sending ? "send" : "recv");
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), op.get()));
  if (failure) std::rethrow_exception(failure);
  const std::size_t element = dtype_size(data.dtype());
  if (!sending && bytes % element != 0) {
    throw Error(Errc::size_mismatch,
                fmt::format("rank {} sent {} bytes, not a whole number of {} elements",
                            op->world_rank(peer), bytes, to_string(data.dtype())),
                {.rank = op->world_rank(op->rank()),
                 .peer = op->world_rank(peer),
                 .operation = "recv",
                 .sequence = op->sequence()});
  }
  (void)self;  // keeps the communicator alive until the operation is done
  co_return bytes / element;
}

asio::awaitable<std::size_t> Communicator::State::staged_point_to_point(
    std::shared_ptr<Communicator> self, std::unique_ptr<CollectiveOp> op, bool sending, Buffer data,
    int peer) {
  // Locals for the lambda to capture, not the parameters (see run_staged).
  std::shared_ptr<Communicator> owner = self;
  std::unique_ptr<CollectiveOp> owned_op = std::move(op);
  const bool is_send = sending;
  const Buffer buffer = data;
  const int partner = peer;
  detail::StagingResources& staging = staging_for(buffer.device());
  const Deadline deadline = owned_op->deadline();
  const Buffer nothing(nullptr, 0, buffer.dtype());
  std::size_t elements = 0;
  detail::WholeRunner transfer = [this, &owner, &owned_op, &elements, is_send, buffer, partner](
                                     Buffer host_in,
                                     Buffer host_out) -> asio::awaitable<std::size_t> {
    elements = co_await run_point_to_point(owner, std::move(owned_op), is_send,
                                           is_send ? host_in : host_out, partner);
    co_return elements* dtype_size(buffer.dtype());
  };
  co_await detail::run_whole_staged(*staging.engine, *staging.pool, is_send ? buffer : nothing,
                                    is_send ? nothing : buffer, std::move(transfer), deadline);
  co_return elements;
}

asio::awaitable<std::size_t> Communicator::State::point_to_point(bool sending, Buffer data,
                                                                 int peer, std::uint64_t sequence,
                                                                 bool may_route) {
  auto op = std::make_unique<CollectiveOp>(world_.transport(), world_ranks_, rank_, id_, sequence,
                                           deadline_after(timeout_), timeout_, *scratch_);
  std::shared_ptr<Communicator> self = self_.shared_from_this();
#if BRAID_WITH_CUDA
  if (may_route && routes_to_nccl(data)) {
    if (sending) return detail::holding(nccl_, counted(nccl_->send(data, peer), data.count()));
    return detail::holding(nccl_, nccl_->recv(data, peer));
  }
#else
  (void)may_route;
#endif
  if (data.memory() == MemoryKind::cuda && !world_.transport().moves_cuda_memory()) {
    return staged_point_to_point(std::move(self), std::move(op), sending, data, peer);
  }
  return run_point_to_point(std::move(self), std::move(op), sending, data, peer);
}

std::uint64_t Communicator::State::numbered_sequence(
    std::unique_ptr<std::atomic<std::uint64_t>[]>& counters, int peer, std::uint64_t number) {
  const std::uint64_t sequence = first_sequence_ + number;
  // What this rank reports as issued when it leaves counts every number below the highest.
  std::atomic<std::uint64_t>& issued = counters[static_cast<std::size_t>(peer)];
  std::uint64_t seen = issued.load(std::memory_order_relaxed);
  while (seen <= sequence && !issued.compare_exchange_weak(seen, sequence + 1)) {
  }
  return sequence;
}

asio::awaitable<void> Communicator::send(Buffer data, int peer) {
  detail::check_point_to_point("send", data, peer, site_of(*this), memory_rule_of(*this));
  const std::uint64_t sequence =
      state_->send_sequence_[static_cast<std::size_t>(peer)].fetch_add(1);
  return discard_count(state_->point_to_point(true, data, peer, sequence, true));
}

asio::awaitable<std::size_t> Communicator::recv(Buffer data, int peer) {
  detail::check_point_to_point("recv", data, peer, site_of(*this), memory_rule_of(*this));
  const std::uint64_t sequence =
      state_->recv_sequence_[static_cast<std::size_t>(peer)].fetch_add(1);
  return state_->point_to_point(false, data, peer, sequence, true);
}

asio::awaitable<void> Communicator::send_numbered(Buffer data, int peer, std::uint64_t number) {
  detail::check_point_to_point("send_numbered", data, peer, site_of(*this), memory_rule_of(*this));
  const std::uint64_t sequence = state_->numbered_sequence(state_->send_sequence_, peer, number);
  return discard_count(state_->point_to_point(true, data, peer, sequence, false));
}

asio::awaitable<std::size_t> Communicator::recv_numbered(Buffer data, int peer,
                                                         std::uint64_t number) {
  detail::check_point_to_point("recv_numbered", data, peer, site_of(*this), memory_rule_of(*this));
  const std::uint64_t sequence = state_->numbered_sequence(state_->recv_sequence_, peer, number);
  return state_->point_to_point(false, data, peer, sequence, false);
}

}  // namespace braid::collectives
