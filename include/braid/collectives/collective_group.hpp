// braid::collectives::CollectiveGroup: the one collective interface. Communicator (host
// and staged CUDA buffers, over shared memory and UCX) and NcclCommunicator (CUDA buffers
// over NCCL) both implement it, so code written against a CollectiveGroup takes either:
//
//   asio::awaitable<void> average(CollectiveGroup& group, Buffer gradients) {
//     co_await group.all_reduce(gradients, ReduceOp::avg);
//   }
//
// Every collective is called by every member in the same order with matching arguments
// (counts, dtypes, roots); a member whose call differs fails with Errc::size_mismatch or a
// fingerprint mismatch naming the ranks, instead of waiting. Point-to-point calls match per
// pair of ranks in call order, independent of the collectives' order.
//
// Cost: one virtual call per operation (a few ns) where the static type is the interface;
// calls on a Communicator or an NcclCommunicator (both final) are direct.
#pragma once

#include <cstddef>
#include <span>

#include <boost/asio/awaitable.hpp>

#include <braid/core/buffer.hpp>
#include <braid/core/reduce_op.hpp>
#include <braid/core/runtime.hpp>

namespace braid::collectives {

class CollectiveGroup {
 public:
  virtual ~CollectiveGroup() = default;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // The runtime whose thread runs the operations.
  virtual Runtime& runtime() noexcept = 0;

  // ---- reductions
  // output[i] = op over ranks of input[i]; same count and dtype everywhere.
  virtual asio::awaitable<void> all_reduce(Buffer input, Buffer output, ReduceOp op) = 0;
  virtual asio::awaitable<void> all_reduce(Buffer data, ReduceOp op) = 0;
  // input holds size() blocks of output.count() elements; rank r gets block r, reduced.
  virtual asio::awaitable<void> reduce_scatter(Buffer input, Buffer output, ReduceOp op) = 0;
  // In place: the result is data's block rank() (data.count() must divide by size()).
  virtual asio::awaitable<void> reduce_scatter(Buffer data, ReduceOp op) = 0;
  // The reduction lands in `output` on `root` only; output is ignored elsewhere (pass {}).
  virtual asio::awaitable<void> reduce(Buffer input, Buffer output, ReduceOp op, int root) = 0;
  virtual asio::awaitable<void> reduce(Buffer data, ReduceOp op, int root) = 0;

  // ---- data movement
  // output = the ranks' inputs, concatenated in rank order (output.count() == size() *
  // input.count()).
  virtual asio::awaitable<void> all_gather(Buffer input, Buffer output) = 0;
  // In place: this rank's block of `data` already holds its contribution.
  virtual asio::awaitable<void> all_gather(Buffer data) = 0;
  // Rank r contributes counts[r] elements; output holds their sum, in rank order. Every
  // rank passes the same counts. `counts` must stay valid until the operation completes.
  virtual asio::awaitable<void> all_gather_v(Buffer input, Buffer output,
                                             std::span<const std::size_t> counts) = 0;
  virtual asio::awaitable<void> broadcast(Buffer data, int root) = 0;
  // output (root only) = every rank's input in rank order; output ignored elsewhere.
  virtual asio::awaitable<void> gather(Buffer input, Buffer output, int root) = 0;
  // Rank r gets block r of the root's input (input ignored elsewhere).
  virtual asio::awaitable<void> scatter(Buffer input, Buffer output, int root) = 0;
  // Block j of input goes to rank j; block i of output comes from rank i.
  virtual asio::awaitable<void> all_to_all(Buffer input, Buffer output) = 0;
  virtual asio::awaitable<void> all_to_all(Buffer data) = 0;
  // send_counts[j] elements to rank j, recv_counts[i] from rank i, packed in rank order.
  // The spans must stay valid until the operation completes.
  virtual asio::awaitable<void> all_to_all_v(Buffer input, std::span<const std::size_t> send_counts,
                                             Buffer output,
                                             std::span<const std::size_t> recv_counts) = 0;
  virtual asio::awaitable<void> barrier() = 0;

  // ---- point to point, matched per pair of ranks in call order. recv returns the
  // elements received: at most data.count() (NcclCommunicator: exactly data.count(), as
  // NCCL has the receiver name the sender's count).
  virtual asio::awaitable<void> send(Buffer data, int peer) = 0;
  virtual asio::awaitable<std::size_t> recv(Buffer data, int peer) = 0;

 protected:
  CollectiveGroup() = default;
  CollectiveGroup(const CollectiveGroup&) = default;
  CollectiveGroup& operator=(const CollectiveGroup&) = default;
};

}  // namespace braid::collectives
