#include "transport/clock_alignment.hpp"

#include <array>
#include <limits>

#include <braid/transport/ucx/tag.hpp>

namespace braid::transport::detail {
namespace {

// World messages travel on communicator 0 with user tags whose sequence field is below
// 2^20; the alignment runs inside World::join, before any user message exists, on the
// last sequence value.
Tag alignment_tag(int round) {
  return Tag{.communicator = 0,
             .sequence = (std::uint64_t{1} << tag_sequence_bits) - 1,
             .step = static_cast<std::uint32_t>(round)};
}

}  // namespace

asio::awaitable<trace::ClockAlignment> align_clocks(UcxWorker& transport, Deadline deadline) {
  trace::ClockAlignment alignment;
  const int rank = transport.rank();
  if (transport.size() == 1) co_return alignment;
  std::array<std::int64_t, 1> stamp{};
  const Buffer message(stamp.data(), stamp.size(), DType::i64);
  if (rank == 0) {
    for (int peer = 1; peer < transport.size(); ++peer) {
      for (int round = 0; round < kClockRounds; ++round) {
        co_await transport.recv(peer, message, alignment_tag(round), deadline);
        stamp[0] = trace::now_ns();
        co_await transport.send(peer, message, alignment_tag(round), deadline);
      }
    }
    co_return alignment;
  }
  std::int64_t best_round_trip = std::numeric_limits<std::int64_t>::max();
  for (int round = 0; round < kClockRounds; ++round) {
    const std::int64_t sent = trace::now_ns();
    co_await transport.send(0, message, alignment_tag(round), deadline);
    co_await transport.recv(0, message, alignment_tag(round), deadline);
    const std::int64_t received = trace::now_ns();
    const std::int64_t round_trip = received - sent;
    if (round_trip < best_round_trip) {
      best_round_trip = round_trip;
      alignment.offset_ns = stamp[0] - (sent + round_trip / 2);
      alignment.round_trip_ns = round_trip;
    }
  }
  co_return alignment;
}

}  // namespace braid::transport::detail
