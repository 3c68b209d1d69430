#include "collectives/collective_op.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <braid/collectives/reduce_kernels.hpp>
#include <braid/core/error.hpp>

namespace braid::collectives::detail {
namespace {

transport::Tag tag_of(std::uint32_t communicator, std::uint64_t sequence, std::uint32_t step) {
  return {.communicator = communicator, .sequence = sequence, .step = step};
}

// A message larger than its receive: the transport refused to truncate it.
Error with_size_hint(const Error& error) {
  return Error(Errc::size_mismatch, error.detail() + " (do the ranks' counts or dtypes differ?)",
               error.context());
}

}  // namespace

CollectiveOp::Subgroup::Subgroup(CollectiveOp& op, std::span<const int> members,
                                 std::uint32_t first_step)
    : op_(op),
      saved_group_(op.group_),
      saved_rank_(op.group_rank_),
      saved_step_base_(op.step_base_) {
  // Members are communicator ranks, so a scope inside a scope names them the same way.
  const auto me = std::find(members.begin(), members.end(), op.rank_);
  BRAID_ENFORCE(me != members.end(), "communicator rank {} is not in the sub-group it runs in",
                op.rank_);
  op.group_ = members;
  op.group_rank_ = static_cast<int>(me - members.begin());
  op.step_base_ = first_step;
}

Message CollectiveOp::send(int peer, Buffer data, std::uint32_t step) {
  return send_reserved(peer, data, (step_base_ + step) % kAlgorithmSteps);
}

Message CollectiveOp::recv(int peer, Buffer data, std::uint32_t step) {
  return recv_reserved(peer, data, (step_base_ + step) % kAlgorithmSteps, /*exact_size=*/true);
}

Message CollectiveOp::send_reserved(int peer, Buffer data, std::uint32_t step) {
  Message message;
  message.peer = peer;
  message.world_peer = world_rank(peer);
  message.bytes = data.size_bytes();
  message.step = step;
  if (abort_) throw_aborted();
  transfers_.push_back({transport_.start_send(message.world_peer, data,
                                              tag_of(communicator_, sequence_, step), deadline()),
                        message.world_peer});
  message.transfer = &transfers_.back().transfer;
  return message;
}

Message CollectiveOp::recv_reserved(int peer, Buffer data, std::uint32_t step, bool exact_size) {
  Message message;
  message.peer = peer;
  message.world_peer = world_rank(peer);
  message.bytes = data.size_bytes();
  message.step = step;
  message.receive = true;
  message.exact = exact_size;
  if (abort_) throw_aborted();
  try {
    transfers_.push_back({transport_.start_recv(message.world_peer, data,
                                                tag_of(communicator_, sequence_, step), deadline()),
                          message.world_peer});
  } catch (const Error& error) {
    // A larger message that had already arrived: refused at the start, not at the wait.
    if (error.code() != Errc::size_mismatch) throw;
    throw with_size_hint(error);
  }
  message.transfer = &transfers_.back().transfer;
  return message;
}

asio::awaitable<std::size_t> CollectiveOp::wait(Message& message) {
  std::size_t received = 0;
  std::exception_ptr truncated;
  try {
    received = co_await transport_.wait(*message.transfer);
  } catch (const Error& error) {
    if (abort_) throw_aborted();
    if (error.code() != Errc::size_mismatch) throw;
    truncated = std::make_exception_ptr(with_size_hint(error));
  }
  if (truncated) std::rethrow_exception(truncated);
  if (message.exact && received != message.bytes) {
    throw Error(Errc::size_mismatch,
                fmt::format("rank {} sent {} bytes as message {} of this operation; this rank's "
                            "arguments call for {} bytes (do the ranks' counts or dtypes differ?)",
                            message.world_peer, received, message.step, message.bytes),
                {.rank = self_world_rank_, .peer = message.world_peer});
  }
  co_return message.receive ? received : message.bytes;
}

asio::awaitable<void> CollectiveOp::wait_all(std::span<Message> messages) {
  for (Message& message : messages) {
    if (message.transfer != nullptr && message.transfer->valid()) co_await wait(message);
  }
}

void CollectiveOp::throw_aborted() const {
  throw Error(Errc::peer_failed, abort_->message, {.rank = self_world_rank_, .peer = abort_->peer});
}

void CollectiveOp::throw_timeout(std::string_view what) const {
  throw Error(Errc::timeout, fmt::format("{} did not happen before the deadline", what),
              {.rank = self_world_rank_});
}

void CollectiveOp::abort(int peer, std::string why) {
  abort_with(peer, fmt::format("rank {} failed: {}", peer, why));
}

std::string CollectiveOp::failed_member() const {
  for (const int world_rank : world_ranks_) {
    if (world_rank == self_world_rank_) continue;
    if (auto why = transport_.peer_failure(world_rank)) {
      return fmt::format("rank {} failed: {}", world_rank, *why);
    }
  }
  return {};
}

void CollectiveOp::abort_with(int peer, std::string message) {
  if (abort_) return;
  abort_ = Abort{peer, std::move(message)};
  for (Started& started : transfers_) {
    if (started.transfer.valid()) transport_.cancel(started.transfer);
  }
  // Those being awaited too: wait() holds them, out of the Transfers' reach. A point-to-point
  // op and a collective may share a sequence number; the reserved step tells them apart.
  if (point_to_point_) {
    transport_.cancel_receives(communicator_, sequence_,
                               [](std::uint32_t step) { return step == kPointToPointStep; });
  } else {
    transport_.cancel_receives(communicator_, sequence_,
                               [](std::uint32_t step) { return step != kPointToPointStep; });
  }
}

asio::awaitable<void> CollectiveOp::settle(std::string why) {
  auto in_flight = [this] {
    return std::any_of(transfers_.begin(), transfers_.end(),
                       [](const Started& s) { return s.transfer.valid() && !s.transfer.ready(); });
  };
  for (Started& started : transfers_) {
    if (started.transfer.valid()) transport_.cancel(started.transfer);
  }
  // Sends to live peers finish as soon as those post their receives, and half-arrived
  // messages as soon as their senders are done: a short grace is usually enough.
  constexpr auto kGrace = std::chrono::milliseconds(200);
  asio::steady_timer timer(co_await asio::this_coro::executor);
  const auto give_up = Clock::now() + kGrace;
  while (in_flight() && Clock::now() < give_up) {
    timer.expires_after(std::chrono::milliseconds(1));
    co_await timer.async_wait(asio::use_awaitable);
  }
  if (in_flight()) {
    for (Started& started : transfers_) {
      if (started.transfer.valid() && !started.transfer.ready()) {
        // The transfer's peer is in its Message only; the op records it beside the transfer.
        transport_.fail_peer(started.world_peer,
                             fmt::format("a collective on this rank failed ({}) while a message "
                                         "with it was in flight, and the endpoint was closed "
                                         "to release the buffer",
                                         why));
      }
    }
  }
  for (Started& started : transfers_) {
    if (!started.transfer.valid()) continue;
    try {
      co_await transport_.wait(started.transfer);
    } catch (const std::exception&) {
      // The operation has failed already; these errors add nothing.
    }
  }
}

namespace {

void enforce_same_shape(const Buffer& dst, const Buffer& a, const Buffer& b) {
  BRAID_ENFORCE(dst.count() == a.count() && a.count() == b.count() && dst.dtype() == a.dtype() &&
                    a.dtype() == b.dtype(),
                "combine over mismatched buffers ({} / {} / {} elements)", dst.count(), a.count(),
                b.count());
}

}  // namespace

void combine(const Buffer& dst, const Buffer& a, const Buffer& b, ReduceOp op) {
  enforce_same_shape(dst, a, b);
  reduce(dst.data(), a.data(), b.data(), dst.count(), dst.dtype(), op);
}

void finish_average(const Buffer& data, ReduceOp op, int contributions) {
  if (op == ReduceOp::avg && contributions > 1) {
    divide(data.data(), data.count(), data.dtype(), contributions);
  }
}

void combine_and_finish(const Buffer& dst, const Buffer& a, const Buffer& b, ReduceOp op,
                        int contributions) {
  if (op != ReduceOp::avg || contributions <= 1) {
    combine(dst, a, b, op);
    return;
  }
  enforce_same_shape(dst, a, b);
  reduce_and_divide(dst.data(), a.data(), b.data(), dst.count(), dst.dtype(), contributions);
}

void copy(const Buffer& dst, const Buffer& src) {
  BRAID_ENFORCE(dst.size_bytes() == src.size_bytes(), "copy of {} bytes into {} bytes",
                src.size_bytes(), dst.size_bytes());
  if (dst.data() != src.data() && src.size_bytes() != 0) {
    std::memcpy(dst.data(), src.data(), src.size_bytes());
  }
}

}  // namespace braid::collectives::detail
