// The keys a World keeps in the job's store, and what its failure key holds. Shared by
// joining (join_wait.cpp) and the World itself (world.cpp).
#pragma once

#include <charconv>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <braid/transport/store.hpp>

namespace braid::transport::detail {

// Where rank `rank` publishes its node and UCX address.
inline std::string address_key(int rank) {
  return fmt::format("braid/world/ucx_address/{}", rank);
}
// The leave barrier's phases: `rank` has started leaving; `rank` is past the first phase.
inline std::string left_key(int rank) {
  return fmt::format("braid/world/left/{}", rank);
}
inline std::string gone_key(int rank) {
  return fmt::format("braid/world/gone/{}", rank);
}

// The job's first failure. Every rank's will sets it to the rank's bare number
// (will_value); a rank leaving through an error sets "<rank>:<why>" itself (announcement).
// Whoever sets it first wins: wills keep a value already there, and an announcement is a
// compare_set against an empty key.
inline constexpr const char* kFailedKey = "braid/world/failed";

inline Bytes will_value(int rank) {
  const std::string text = std::to_string(rank);
  return Bytes(text.begin(), text.end());
}

inline Bytes announcement(int rank, std::string_view why) {
  const std::string text = fmt::format("{}:{}", rank, why);
  return Bytes(text.begin(), text.end());
}

// A failure as the failure key holds it; rank -1 where the bytes name no rank.
struct Failure {
  int rank = -1;
  std::string why;
};

inline Failure failure_in(const Bytes& value) {
  const auto* first = reinterpret_cast<const char*>(value.data());
  const auto* last = first + value.size();
  int rank = -1;
  auto [end, error] = std::from_chars(first, last, rank);
  if (error != std::errc() || rank < 0) return {};
  if (end == last) {
    return {.rank = rank, .why = "its store connection closed (process exited or was killed)"};
  }
  if (*end != ':') return {};
  return {.rank = rank, .why = std::string(end + 1, last)};
}

}  // namespace braid::transport::detail
