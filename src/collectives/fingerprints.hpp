// Fingerprints (BRAID_DEBUG=detail): before its algorithm, every rank sends what it called
// to every other and compares, so a desync fails on every rank, both calls named, before
// any data moves. The Fingerprint itself, fingerprint_of() and describe() are in
// collective_call.hpp: the shared-memory arena's slots carry fingerprints too.
#pragma once

#include <cstdint>

#include <boost/asio/awaitable.hpp>

#include "collectives/collective_call.hpp"
#include "collectives/collective_op.hpp"

namespace braid::collectives::detail {

// BRAID_DEBUG: "detail" fingerprints every call, "off" or unset none; anything else throws
// Errc::invalid_environment.
bool fingerprints_from_environment();

// Sends this rank's fingerprint of `call` to every other member and compares theirs with
// it: Errc::desync, naming both calls, on the first that differs. O(P) small messages on
// the reserved fingerprint step (kFingerprintStep).
asio::awaitable<void> exchange_fingerprints(CollectiveOp& op, const CollectiveCall& call,
                                            std::uint32_t communicator);

}  // namespace braid::collectives::detail
