#include "collective_op.hpp"

#include <cstring>

#include <fmt/format.h>

#include <braid/collectives/reduce_kernels.hpp>
#include <braid/core/error.hpp>

namespace braid::collectives::detail {
namespace {

transport::Tag tag_of(std::uint32_t communicator, std::uint64_t sequence, std::uint32_t step) {
  return {.communicator = communicator, .sequence = sequence, .step = step};
}

}  // namespace

Message CollectiveOp::send(int peer, Buffer data, std::uint32_t step) {
  return send_reserved(peer, data, step % kAlgorithmSteps);
}

Message CollectiveOp::recv(int peer, Buffer data, std::uint32_t step) {
  return recv_reserved(peer, data, step % kAlgorithmSteps, /*exact_size=*/true);
}

Message CollectiveOp::send_reserved(int peer, Buffer data, std::uint32_t step) {
  Message message;
  message.peer = peer;
  message.bytes = data.size_bytes();
  message.step = step;
  message.transfer =
      transport_.start_send(world_rank(peer), data, tag_of(communicator_, sequence_, step), deadline_);
  return message;
}

Message CollectiveOp::recv_reserved(int peer, Buffer data, std::uint32_t step, bool exact_size) {
  Message message;
  message.peer = peer;
  message.bytes = data.size_bytes();
  message.step = step;
  message.receive = true;
  message.exact = exact_size;
  message.transfer =
      transport_.start_recv(world_rank(peer), data, tag_of(communicator_, sequence_, step), deadline_);
  return message;
}

asio::awaitable<std::size_t> CollectiveOp::wait(Message& message) {
  std::size_t received = 0;
  std::exception_ptr truncated;
  try {
    received = co_await transport_.wait(message.transfer);
  } catch (const Error& error) {
    if (error.code() != Errc::size_mismatch) throw;
    // A message larger than its receive: the transport refused to truncate it.
    truncated = std::make_exception_ptr(
        Error(Errc::size_mismatch,
              error.detail() + " (do the ranks' counts or dtypes differ?)", error.context()));
  }
  if (truncated) std::rethrow_exception(truncated);
  if (message.exact && received != message.bytes) {
    throw Error(Errc::size_mismatch,
                fmt::format("rank {} sent {} bytes as message {} of this operation; this rank's "
                            "arguments call for {} bytes (do the ranks' counts or dtypes differ?)",
                            world_rank(message.peer), received, message.step, message.bytes),
                {.rank = world_rank(rank_), .peer = world_rank(message.peer)});
  }
  co_return message.receive ? received : message.bytes;
}

asio::awaitable<void> CollectiveOp::wait_all(std::span<Message> messages) {
  for (Message& message : messages) {
    if (message.transfer.valid()) co_await wait(message);
  }
}

void combine(const Buffer& dst, const Buffer& a, const Buffer& b, ReduceOp op) {
  BRAID_ENFORCE(dst.count() == a.count() && a.count() == b.count() && dst.dtype() == a.dtype() &&
                    a.dtype() == b.dtype(),
                "combine over mismatched buffers ({} / {} / {} elements)", dst.count(), a.count(),
                b.count());
  reduce(dst.data(), a.data(), b.data(), dst.count(), dst.dtype(), op);
}

void finish_average(const Buffer& data, ReduceOp op, int contributions) {
  if (op == ReduceOp::avg && contributions > 1) {
    divide(data.data(), data.count(), data.dtype(), contributions);
  }
}

void copy(const Buffer& dst, const Buffer& src) {
  BRAID_ENFORCE(dst.size_bytes() == src.size_bytes(), "copy of {} bytes into {} bytes",
                src.size_bytes(), dst.size_bytes());
  if (dst.data() != src.data() && src.size_bytes() != 0) {
    std::memcpy(dst.data(), src.data(), src.size_bytes());
  }
}

}  // namespace braid::collectives::detail
