// Communicator's collective entry points (communicator.hpp): each describes its call in a
// CollectiveCall and hands it to submit() (communicator.cpp), which checks it and takes its
// place in the order. A rooted call's other ranks pass no root buffer on (they may pass
// anything there).
#include <braid/collectives/communicator.hpp>

#include "collectives/call_checks.hpp"
#include "collectives/collective_call.hpp"
#include "collectives/communicator_internal.hpp"

namespace braid::collectives {

using detail::site_of;

asio::awaitable<void> Communicator::all_reduce(Buffer input, Buffer output, ReduceOp op) {
  return state_->submit({.kind = CollectiveKind::all_reduce,
                         .input = input,
                         .output = output,
                         .reduce_op = op,
                         .bytes = input.size_bytes()});
}

asio::awaitable<void> Communicator::all_reduce(Buffer data, ReduceOp op) {
  return all_reduce(data, data, op);
}

asio::awaitable<void> Communicator::reduce_scatter(Buffer input, Buffer output, ReduceOp op) {
  return state_->submit({.kind = CollectiveKind::reduce_scatter,
                         .input = input,
                         .output = output,
                         .reduce_op = op,
                         .bytes = input.size_bytes()});
}

asio::awaitable<void> Communicator::reduce_scatter(Buffer data, ReduceOp op) {
  return reduce_scatter(
      data, detail::rank_block(CollectiveKind::reduce_scatter, data, site_of(*this)), op);
}

asio::awaitable<void> Communicator::reduce(Buffer input, Buffer output, ReduceOp op, int root) {
  return state_->submit({.kind = CollectiveKind::reduce,
                         .input = input,
                         .output = state_->rank_ == root ? output : Buffer{},
                         .reduce_op = op,
                         .root = root,
                         .bytes = input.size_bytes()});
}

asio::awaitable<void> Communicator::reduce(Buffer data, ReduceOp op, int root) {
  return reduce(data, data, op, root);
}

asio::awaitable<void> Communicator::all_gather(Buffer input, Buffer output) {
  return state_->submit({.kind = CollectiveKind::all_gather,
                         .input = input,
                         .output = output,
                         .bytes = output.size_bytes()});
}

asio::awaitable<void> Communicator::all_gather(Buffer data) {
  return all_gather(detail::rank_block(CollectiveKind::all_gather, data, site_of(*this)), data);
}

asio::awaitable<void> Communicator::all_gather_v(Buffer input, Buffer output,
                                                 std::span<const std::size_t> counts) {
  return state_->submit({.kind = CollectiveKind::all_gather,
                         .input = input,
                         .output = output,
                         .counts = counts,
                         .variable = true,
                         .bytes = output.size_bytes()});
}

asio::awaitable<void> Communicator::broadcast(Buffer data, int root) {
  return state_->submit({.kind = CollectiveKind::broadcast,
                         .input = data,
                         .output = data,
                         .root = root,
                         .bytes = data.size_bytes()});
}

asio::awaitable<void> Communicator::gather(Buffer input, Buffer output, int root) {
  return state_->submit({.kind = CollectiveKind::gather,
                         .input = input,
                         .output = state_->rank_ == root ? output : Buffer{},
                         .root = root,
                         .bytes = input.size_bytes() * static_cast<std::size_t>(size())});
}

asio::awaitable<void> Communicator::scatter(Buffer input, Buffer output, int root) {
  return state_->submit({.kind = CollectiveKind::scatter,
                         .input = state_->rank_ == root ? input : Buffer{},
                         .output = output,
                         .root = root,
                         .bytes = output.size_bytes() * static_cast<std::size_t>(size())});
}

asio::awaitable<void> Communicator::all_to_all(Buffer input, Buffer output) {
  return state_->submit({.kind = CollectiveKind::all_to_all,
                         .input = input,
                         .output = output,
                         .bytes = input.size_bytes()});
}

asio::awaitable<void> Communicator::all_to_all(Buffer data) {
  return all_to_all(data, data);
}

asio::awaitable<void> Communicator::all_to_all_v(Buffer input,
                                                 std::span<const std::size_t> send_counts,
                                                 Buffer output,
                                                 std::span<const std::size_t> recv_counts) {
  return state_->submit({.kind = CollectiveKind::all_to_all,
                         .input = input,
                         .output = output,
                         .counts = send_counts,
                         .recv_counts = recv_counts,
                         .variable = true,
                         .bytes = input.size_bytes()});
}

asio::awaitable<void> Communicator::barrier() {
  return state_->submit({.kind = CollectiveKind::barrier});
}

}  // namespace braid::collectives
