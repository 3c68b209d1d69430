#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include <braid/collectives/agreement.hpp>
#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>
#include <braid/core/excerpt.hpp>

namespace braid::collectives {
namespace {

// FNV-1a: a value's identity in the gathered table. Not a defence against anyone, only
// against two different settings colliding by chance (2^-64).
std::uint64_t hash_of(std::string_view text, std::uint64_t hash = 14695981039346656037ULL) {
  for (const char c : text) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return hash;
}

// A value's slot: its name's and value's hash, then the value's first bytes for messages.
constexpr std::size_t kHashBytes = 8;
constexpr std::size_t kQuoted = kAgreedValueBytes - kHashBytes;

void fill_slot(std::uint8_t* slot, const AgreedValue& v) {
  const std::uint64_t hash = hash_of(v.value, hash_of(v.name) ^ 0x5bd1e995ULL);
  std::memcpy(slot, &hash, kHashBytes);
  std::memset(slot + kHashBytes, 0, kQuoted);
  std::memcpy(slot + kHashBytes, v.value.data(), std::min(v.value.size(), kQuoted));
}

std::string quoted(const std::uint8_t* slot) {
  const char* text = reinterpret_cast<const char*>(slot + kHashBytes);
  return excerpt(std::string_view(text, strnlen(text, kQuoted)));
}

[[noreturn]] void disagree(const Communicator& comm, std::string message) {
  throw Error(Errc::invalid_argument, std::move(message),
              {.rank = comm.world_rank(comm.rank()), .operation = "expect_agreement"});
}

}  // namespace

asio::awaitable<void> expect_agreement(Communicator& comm, std::vector<AgreedValue> values) {
  const auto ranks = static_cast<std::size_t>(comm.size());
  // First the names: their number and hash, so that ranks naming different values fail
  // here, clearly, rather than in a gather of different sizes.
  std::uint64_t names = hash_of(std::to_string(values.size()));
  for (const AgreedValue& v : values) names = hash_of(v.name, names);
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(names)};
  std::vector<std::int64_t> all_names(ranks);
  co_await comm.all_gather(Buffer(mine), Buffer(all_names));
  for (std::size_t r = 1; r < ranks; ++r) {
    if (all_names[r] != all_names[0]) {
      disagree(comm, fmt::format("ranks {} and {} check different settings (another program, or "
                                 "another version of it?)",
                                 comm.world_rank(0), comm.world_rank(static_cast<int>(r))));
    }
  }
  std::vector<std::uint8_t> slots(values.size() * kAgreedValueBytes);
  for (std::size_t i = 0; i < values.size(); ++i) {
    fill_slot(slots.data() + i * kAgreedValueBytes, values[i]);
  }
  std::vector<std::uint8_t> table(slots.size() * ranks);
  co_await comm.all_gather(Buffer(slots), Buffer(table));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint8_t* first = table.data() + i * kAgreedValueBytes;
    for (std::size_t r = 1; r < ranks; ++r) {
      const std::uint8_t* other = table.data() + (r * values.size() + i) * kAgreedValueBytes;
      if (std::memcmp(first, other, kHashBytes) == 0) continue;
      disagree(comm, fmt::format("the ranks disagree on {}: rank {} has {}, rank {} has {}; every "
                                 "rank must be given the same",
                                 values[i].name, comm.world_rank(0), quoted(first),
                                 comm.world_rank(static_cast<int>(r)), quoted(other)));
    }
  }
}

}  // namespace braid::collectives
