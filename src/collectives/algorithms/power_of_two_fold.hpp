// Recursive doubling and halving-doubling work on a power-of-two number of ranks. With
// P = p2 + extra ranks (p2 the largest power of two <= P), the first 2*extra ranks pair
// up before the algorithm: each even one hands its vector to the odd one above it and
// sits out; afterwards the odd one hands the result back. That costs two extra full
// messages for the paired ranks (MPICH's and OpenMPI's treatment of non-powers of two).
#pragma once

#include <cstdint>

#include <boost/asio/awaitable.hpp>

#include "collectives/collective_op.hpp"

namespace braid::collectives::detail {

struct PowerOfTwoFold {
  int power = 1;      // p2
  int extra = 0;      // P - p2
  int new_rank = -1;  // this rank among the p2, or -1 for an even rank that sits out

  PowerOfTwoFold(int rank, int world_size);
  // The communicator rank of the participant numbered `participant` among the p2.
  int rank_of(int participant) const noexcept {
    return participant < extra ? 2 * participant + 1 : participant + extra;
  }
  // log2(p2): the number of rounds of a doubling or halving loop.
  int rounds() const noexcept;
};

// Before the algorithm: a sitting-out rank sends `data`; its partner receives it and
// combines it into `data`. Message step 0.
asio::awaitable<void> fold_in(CollectiveOp& op, const PowerOfTwoFold& fold, const Buffer& data,
                              ReduceOp reduce_op);
// After it: the partner sends the result back into the sitting-out rank's `data`.
asio::awaitable<void> fold_out(CollectiveOp& op, const PowerOfTwoFold& fold, const Buffer& data,
                               std::uint32_t step);

}  // namespace braid::collectives::detail
