// Joining's two waits, each saying whom it waits for: for rank 0's store, and for every
// rank's address. Ranks start in any order and a launcher-less job has no one else to tell
// a dead rank from a slow one, so while a wait goes on it logs (warn) every 10 s, or three
// times within a shorter timeout, which ranks have not arrived; when it times out, its
// error names them and the setting that bounded it (BRAID_TIMEOUT, or the program's
// WorldOptions::join_timeout).
//
// Cost: one store get per rank, all outstanding at once, and one on the job's first event.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <braid/core/deadline.hpp>
#include <braid/core/error.hpp>
#include <braid/transport/store/store.hpp>
#include <braid/transport/world.hpp>

#include "transport/world_keys.hpp"

namespace braid::transport::detail {

// StoreClient::connect, reporting while it retries. Its timeout is Errc::timeout naming
// rank 0, which serves the store. `options` outlive the wait.
asio::awaitable<std::unique_ptr<StoreClient>> connect_to_store(asio::any_io_executor executor,
                                                               StoreAddress address,
                                                               Deadline deadline,
                                                               const WorldOptions& options);

// One round of joining in which every rank publishes a value under its key: the key, and
// what the wait's error calls the value.
struct JoinRound {
  std::string (*key_of)(int rank);
  const char* one;      // "its address"
  const char* several;  // "their addresses"
};
inline constexpr JoinRound kAddressRound{address_key, "its address", "their addresses"};
inline constexpr JoinRound kPlacementRound{placement_key, "its node and machine",
                                           "their nodes and machines"};

// Every rank's value for `round`, in rank order, waiting for the ranks still joining. A
// will firing meanwhile (a rank that reached the store died) ends the wait at once with
// Errc::peer_failed naming that rank; at `deadline`, Errc::timeout names the ranks still
// missing. A broken store connection is thrown as the store reports it. `store` and
// `options` outlive the wait.
// `ranks_per_node`: when the launchers number ranks in blocks of this many per node (0 when
// not, or on one node), the error names the nodes of the missing ranks too.
asio::awaitable<std::vector<Bytes>> await_published(StoreClient& store, int world_size,
                                                    int ranks_per_node, JoinRound round,
                                                    Deadline deadline, const WorldOptions& options);

// The error for a join that a rank's failure ended: the event log's first event, `failed`
// (a failure event), names it and why. `also`, when not empty, is what else this rank saw
// go wrong (UCX's words for the connect the death broke), in parentheses after it.
Error failed_while_joining(const Event& failed, const ErrorContext& context,
                           std::string_view also = {});

}  // namespace braid::transport::detail
