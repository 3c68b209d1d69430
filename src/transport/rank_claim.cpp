#include "transport/rank_claim.hpp"

#include <array>
#include <random>
#include <string>
#include <unistd.h>

#include <fmt/format.h>

#include <braid/core/error.hpp>

namespace braid::transport {
namespace {

std::string claim_key(int rank) {
  return fmt::format("braid/world/claim/{}", rank);
}

// Who holds the claim, as the refusal names it, and a random number that makes this
// claim unlike any other, a second claim from the same process included.
std::string claimant() {
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
  std::random_device entropy;
  const std::uint64_t nonce = (std::uint64_t{entropy()} << 32) | entropy();
  return fmt::format("pid {} on {} (claim {:016x})", getpid(), host.data(), nonce);
}

}  // namespace

asio::awaitable<void> claim_rank(StoreClient& store, int rank) {
  const std::string mine = claimant();
  const Bytes desired(mine.begin(), mine.end());
  Bytes none;
  // Absent is the only state that takes the claim; the value afterwards says who won.
  Bytes holder = co_await store.compare_set(claim_key(rank), std::move(none), desired);
  if (holder == desired) co_return;
  throw Error(Errc::refused,
              fmt::format("rank {} is already taken in this job, by {}; was the same rank given "
                          "to two processes?",
                          rank, std::string(holder.begin(), holder.end())),
              {.rank = rank, .operation = "World::join"});
}

}  // namespace braid::transport
