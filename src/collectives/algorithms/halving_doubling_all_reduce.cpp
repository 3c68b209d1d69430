// Halving-doubling all-reduce (Rabenseifner): a reduce-scatter by recursive halving (in
// round i, swap half of the current window with the rank p2/2^(i+1) away and keep
// reducing the half you keep), then an all-gather by recursive doubling that retraces
// the same pairs.
//
// Cost (P ranks, n bytes; p2 the power of two <= P):
//   time ~ 2 log2(p2) alpha + 2 (p2-1)/p2 n beta + (p2-1)/p2 n gamma, plus
//   2 (alpha + n beta) when P is not a power of two (power_of_two_fold.hpp)
// Ring's bandwidth with log2(P) latency terms instead of P-1: the choice for medium
// vectors. Each block is reduced at one rank, so all ranks end bit-identical.
// Scratch: n/2.
#include "collectives/algorithms/algorithms.hpp"
#include "collectives/algorithms/power_of_two_fold.hpp"

namespace braid::collectives::detail {

asio::awaitable<void> halving_doubling_all_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                                  ReduceOp reduce_op) {
  const Buffer data = output;
  copy(data, input);
  const PowerOfTwoFold fold(op.rank(), op.size());
  co_await fold_in(op, fold, data, reduce_op);
  if (fold.new_rank >= 0) {
    const EvenSplit blocks{data.count(), static_cast<std::size_t>(fold.power)};
    auto window = [&](std::size_t lo, std::size_t hi) {
      return data.slice(blocks.offset(lo), blocks.offset(hi) - blocks.offset(lo));
    };
    ScratchPool::Lease scratch = op.scratch(
        blocks.offset(static_cast<std::size_t>(fold.power) / 2 + 1) * dtype_size(data.dtype()));
    const auto me = static_cast<std::size_t>(fold.new_rank);
    std::size_t lo = 0;
    std::size_t hi = static_cast<std::size_t>(fold.power);
    std::uint32_t step = 1;
    trace::AsyncSpan halving = op.phase("halving_doubling.reduce_scatter", data.size_bytes());
    for (std::size_t distance = hi / 2; distance >= 1; distance /= 2, ++step) {
      const int partner = fold.rank_of(static_cast<int>(me ^ distance));
      const std::size_t mid = lo + (hi - lo) / 2;
      const bool keep_lower = (me & distance) == 0;
      const Buffer keep = keep_lower ? window(lo, mid) : window(mid, hi);
      const Buffer give = keep_lower ? window(mid, hi) : window(lo, mid);
      const Buffer arrived = scratch.buffer(data.dtype(), keep.count());
      Message received = op.recv(partner, arrived, step);
      Message sent = op.send(partner, give, step);
      co_await op.wait(sent);
      co_await op.wait(received);
      combine(keep, keep, arrived, reduce_op);
      if (keep_lower) {
        hi = mid;
      } else {
        lo = mid;
      }
    }
    finish_average(window(lo, hi), reduce_op, op.size());
    halving.end();
    const trace::AsyncSpan doubling = op.phase("halving_doubling.all_gather", data.size_bytes());
    for (std::size_t distance = 1; distance < static_cast<std::size_t>(fold.power);
         distance *= 2, ++step) {
      const int partner = fold.rank_of(static_cast<int>(me ^ distance));
      const std::size_t width = hi - lo;
      const bool extend_up = (me & distance) == 0;
      const std::size_t other_lo = extend_up ? hi : lo - width;
      Message received = op.recv(partner, window(other_lo, other_lo + width), step);
      Message sent = op.send(partner, window(lo, hi), step);
      co_await op.wait(sent);
      co_await op.wait(received);
      lo = std::min(lo, other_lo);
      hi = lo + 2 * width;
    }
  }
  co_await fold_out(op, fold, data, static_cast<std::uint32_t>(2 * fold.rounds() + 1));
}

}  // namespace braid::collectives::detail
