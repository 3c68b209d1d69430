#include "collectives/algorithms/power_of_two_fold.hpp"

#include <bit>

namespace braid::collectives::detail {

PowerOfTwoFold::PowerOfTwoFold(int rank, int world_size)
    : power(static_cast<int>(std::bit_floor(static_cast<unsigned>(world_size)))),
      extra(world_size - power) {
  if (rank < 2 * extra) {
    new_rank = rank % 2 == 1 ? rank / 2 : -1;
  } else {
    new_rank = rank - extra;
  }
}

int PowerOfTwoFold::rounds() const noexcept {
  return std::countr_zero(static_cast<unsigned>(power));
}

asio::awaitable<void> fold_in(CollectiveOp& op, const PowerOfTwoFold& fold, const Buffer& data,
                              ReduceOp reduce_op) {
  const int rank = op.rank();
  if (rank >= 2 * fold.extra) co_return;
  if (fold.new_rank < 0) {
    Message sent = op.send(rank + 1, data, 0);
    co_await op.wait(sent);
    co_return;
  }
  ScratchPool::Lease scratch = op.scratch(data.size_bytes());
  const Buffer arrived = scratch.buffer(data.dtype(), data.count());
  Message received = op.recv(rank - 1, arrived, 0);
  co_await op.wait(received);
  combine(data, data, arrived, reduce_op);
}

asio::awaitable<void> fold_out(CollectiveOp& op, const PowerOfTwoFold& fold, const Buffer& data,
                               std::uint32_t step) {
  const int rank = op.rank();
  if (rank >= 2 * fold.extra) co_return;
  Message message =
      fold.new_rank < 0 ? op.recv(rank + 1, data, step) : op.send(rank - 1, data, step);
  co_await op.wait(message);
}

}  // namespace braid::collectives::detail
