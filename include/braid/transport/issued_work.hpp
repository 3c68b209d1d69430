// IssuedWork: what a rank had issued on each of its communicators when its program ended.
// A rank that leaves the job cleanly publishes it (World, "Leaving"); a peer still waiting
// on that rank compares it with what it waits for, and fails an operation the leaver never
// issued at once, naming it, rather than at its deadline: ranks that ran different numbers
// of steps, or a rank that returned early, end in a clear error instead of a hang.
//
// Communicators number their collectives and, per peer and direction, their point-to-point
// messages with sequence numbers every member agrees on (collectives/communicator.hpp), so
// "issued" is a number per communicator and per peer: an operation at a sequence number at
// or above it will never be joined by the leaver.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <braid/transport/store/store.hpp>

namespace braid::transport {

// Point-to-point messages with one peer: sequence numbers below `sent` (messages to that
// peer) and below `received` (receives from it) were issued.
struct PeerMessages {
  int world_rank = -1;
  std::uint64_t sent = 0;
  std::uint64_t received = 0;

  friend bool operator==(const PeerMessages&, const PeerMessages&) = default;
};

struct CommunicatorWork {
  std::uint32_t communicator = 0;    // its id (tag.hpp)
  std::uint64_t first_sequence = 0;  // tells this use of the id from an earlier one
  std::uint64_t issued = 0;          // collectives below this sequence number were issued
  // Peers this rank exchanged point-to-point messages with; a peer not listed, none.
  std::vector<PeerMessages> point_to_point;

  friend bool operator==(const CommunicatorWork&, const CommunicatorWork&) = default;
};

using IssuedWork = std::vector<CommunicatorWork>;

// A compact little-endian encoding, for the store. decode throws Error(protocol_error) on
// bytes that are not one.
Bytes encode_issued_work(const IssuedWork& work);
IssuedWork decode_issued_work(std::span<const std::uint8_t> bytes);

}  // namespace braid::transport
