// Makes each rank of a job one process's alone. The store's token keeps strangers out,
// but a second process started with the right token and a rank already taken would
// otherwise overwrite that rank's address and register a will of its own, whose firing
// (when it exits) fails the job as if the real rank had died. World::async_join claims its
// rank right after connecting, before it registers its will or publishes anything.
//
// Cost: one compare_set on the store per rank, once per job.
#pragma once

#include <boost/asio/awaitable.hpp>

#include <braid/transport/store/store.hpp>

namespace braid::transport {

// Claims `rank` in the job whose store `store` is connected to. The first claim of a
// rank holds for as long as the store serves (a claim is never released: a rank that
// died is not replaced within a job). Throws Error(Errc::refused, rank = `rank`) when
// another process -- or another claim from this one -- holds the rank, naming the rank
// and the holder ("pid 4242 on node-a").
asio::awaitable<void> claim_rank(StoreClient& store, int rank);

}  // namespace braid::transport
