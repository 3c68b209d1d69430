// The keys a World keeps in the job's store, and what its failure key holds. Shared by
// joining (join_wait.cpp) and the World itself (world.cpp).
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <braid/transport/store/store.hpp>

namespace braid::transport::detail {

// Where rank `rank` publishes its node and UCX address.
inline std::string address_key(int rank) {
  return fmt::format("braid/world/ucx_address/{}", rank);
}
// Where rank `rank` publishes its node and machine (machine_identity.hpp), in jobs of
// several nodes.
inline std::string placement_key(int rank) {
  return fmt::format("braid/world/placement/{}", rank);
}
// The leave barrier's phases: `rank` has started leaving; `rank` is past the first phase.
inline std::string left_key(int rank) {
  return fmt::format("braid/world/left/{}", rank);
}
inline std::string gone_key(int rank) {
  return fmt::format("braid/world/gone/{}", rank);
}

// The job's events, a store log (StoreClient::append): every failure and every clean leave,
// in the order the store saw them, so a rank follows them all with one pending get. A
// rank's will appends "F<rank>" when its connection closes (it died); a rank leaving
// through an error appends "F<rank>:<why>" itself; a rank leaving cleanly appends
// "E<rank>:" and its issued work (issued_work.hpp). The first failure in the log is the
// job's first failure, the same for every rank.
inline constexpr const char* kEventsKey = "braid/world/events";

inline std::string event_key(std::int64_t index) {
  return fmt::format("{}/{}", kEventsKey, index);
}

inline Bytes will_value(int rank) {
  const std::string text = fmt::format("F{}", rank);
  return Bytes(text.begin(), text.end());
}

inline Bytes failure_event(int rank, std::string_view why) {
  const std::string text = fmt::format("F{}:{}", rank, why);
  return Bytes(text.begin(), text.end());
}

inline Bytes ended_event(int rank, const Bytes& issued_work) {
  const std::string head = fmt::format("E{}:", rank);
  Bytes event(head.begin(), head.end());
  event.insert(event.end(), issued_work.begin(), issued_work.end());
  return event;
}

// An event as the log holds it; rank -1 where the bytes name no rank.
struct Event {
  enum class Kind { failed, ended };
  Kind kind = Kind::failed;
  int rank = -1;
  std::string why;  // failed: what happened
  Bytes work;       // ended: its issued work, encoded
};

inline Event event_in(const Bytes& value) {
  const auto* first = reinterpret_cast<const char*>(value.data());
  const auto* last = first + value.size();
  if (first == last || (*first != 'F' && *first != 'E')) return {};
  const Event::Kind kind = *first == 'F' ? Event::Kind::failed : Event::Kind::ended;
  int rank = -1;
  auto [end, error] = std::from_chars(first + 1, last, rank);
  if (error != std::errc() || rank < 0) return {};
  if (end == last) {
    if (kind == Event::Kind::ended) return {};
    return {.kind = kind,
            .rank = rank,
            .why =
                "its store connection closed (the process exited or was killed) or went "
                "silent (its node or the network to it lost)"};
  }
  if (*end != ':') return {};
  if (kind == Event::Kind::failed) {
    return {.kind = kind, .rank = rank, .why = std::string(end + 1, last)};
  }
  const auto offset = static_cast<std::size_t>(end + 1 - first);
  return {.kind = kind, .rank = rank, .work = Bytes(value.begin() + offset, value.end())};
}

}  // namespace braid::transport::detail
