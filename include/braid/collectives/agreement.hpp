// Agreement before work: what every rank of a communicator must hold alike (the model's
// shape, the number of steps, seeds, the schedule), compared once before the first step. A
// rank given another value would otherwise train to the end on a silently different model,
// or hang where its calls stop pairing up with its peers'.
//
//   co_await braid::collectives::expect_agreement(*comm, {{"--steps", std::to_string(steps)},
//                                                          {"--heads", std::to_string(heads)}});
//
// Every rank gathers every rank's values and checks them the same way, so a disagreement
// fails every rank at once with the same Error(Errc::invalid_argument): the first name whose
// values differ, rank 0's value, and the first rank that holds another and its value. Ranks
// that name different values (or a different number of them) fail the same way.
//
// Cost: two all_gathers, one of 8 bytes and one of kAgreedValueBytes per value, per rank.
// Values are compared whole (by a 64-bit hash) and quoted by their first bytes.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

namespace braid::collectives {

class Communicator;

struct AgreedValue {
  std::string name;   // what the user set it with: "--steps"
  std::string value;  // as text: "60"
};

inline constexpr std::size_t kAgreedValueBytes = 32;

boost::asio::awaitable<void> expect_agreement(Communicator& comm, std::vector<AgreedValue> values);

}  // namespace braid::collectives
