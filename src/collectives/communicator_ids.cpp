#include "collectives/communicator_ids.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace braid::collectives::detail {
namespace {

constexpr std::string_view kFreshIdCounter = "braid/collectives/next_communicator";
constexpr std::string_view kSerialCounter = "braid/collectives/next_communicator_serial";
constexpr std::string_view kFreePool = "braid/collectives/free_communicator_ids";

std::string release_key(std::int64_t serial) {
  return fmt::format("braid/collectives/communicator/{}/released", serial);
}

// Store values here are arrays of 64-bit words, the first a nonce naming the write.
using Words = std::vector<std::uint64_t>;

transport::Bytes to_bytes(const Words& words) {
  transport::Bytes bytes(words.size() * sizeof(std::uint64_t));
  if (!words.empty()) std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

Words to_words(const transport::Bytes& bytes) {
  Words words(bytes.size() / sizeof(std::uint64_t));
  if (!words.empty()) std::memcpy(words.data(), bytes.data(), words.size() * sizeof(words[0]));
  return words;
}

// Unique to one write in the whole job: compare_set answers with the value stored
// afterwards, and two writers that compute the same new value from the same old one
// could otherwise each take the answer for their own success.
std::uint64_t next_nonce(int world_rank) {
  static std::atomic<std::uint64_t> writes{0};
  return (static_cast<std::uint64_t>(world_rank) << 40) | writes.fetch_add(1);
}

// Replaces the words after the nonce at `key` with change(words), retrying while other
// writers get in between. `change` sees an empty vector where the key is absent.
template <class Change>
asio::awaitable<void> update(transport::StoreClient& store, std::string key, int world_rank,
                             Change change) {
  transport::Bytes seen;  // absent, as far as we know
  while (true) {
    Words words = to_words(seen);
    const Words body = words.empty() ? Words{} : Words(words.begin() + 1, words.end());
    Words desired{next_nonce(world_rank)};
    for (std::uint64_t word : change(body)) desired.push_back(word);
    const transport::Bytes wanted = to_bytes(desired);
    transport::Bytes stored = co_await store.compare_set(key, seen, wanted);
    if (stored == wanted) co_return;
    seen = std::move(stored);
  }
}

}  // namespace

void CommunicatorIds::released(const Release& release) {
  std::lock_guard lock(mutex_);
  released_.push_back(release);
}

std::vector<Release> CommunicatorIds::take_released() {
  std::lock_guard lock(mutex_);
  return std::exchange(released_, {});
}

std::int64_t CommunicatorIds::next_subgroup(const std::string& members) {
  std::lock_guard lock(mutex_);
  return subgroups_[members]++;
}

asio::awaitable<void> publish_releases(transport::StoreClient& store, std::vector<Release> releases,
                                       int world_rank) {
  for (const Release& release : releases) {
    bool last = false;
    std::uint64_t unused_sequence = 0;
    // The record: members that let go, and the highest first-unused sequence among them.
    co_await update(store, release_key(release.serial), world_rank, [&](const Words& record) {
      const std::uint64_t count = (record.size() == 2 ? record[0] : 0) + 1;
      unused_sequence = std::max(record.size() == 2 ? record[1] : 0, release.unused_sequence);
      last = count == static_cast<std::uint64_t>(release.members);
      return Words{count, unused_sequence};
    });
    if (!last) continue;
    co_await update(store, std::string(kFreePool), world_rank, [&](const Words& pool) {
      Words grown = pool;
      grown.push_back(release.id);
      grown.push_back(unused_sequence);
      return grown;
    });
    co_await store.erase(release_key(release.serial));
  }
}

asio::awaitable<std::vector<CommunicatorName>> allocate_names(transport::StoreClient& store,
                                                              std::size_t count, int world_rank) {
  std::vector<CommunicatorName> names(count);
  if (count == 0) co_return names;
  const auto wanted = static_cast<std::int64_t>(count);
  const std::int64_t serials = co_await store.add(std::string(kSerialCounter), wanted);
  for (std::size_t i = 0; i < count; ++i) {
    names[i].serial = kFirstSplitId + serials - wanted + static_cast<std::int64_t>(i);
  }
  // Freed ids first, oldest first; each entry is (id, first sequence).
  std::size_t reused = 0;
  co_await update(store, std::string(kFreePool), world_rank, [&](const Words& pool) {
    reused = std::min(count, pool.size() / 2);
    for (CommunicatorName& name : names) name.first_sequence = 0;  // from an earlier try
    for (std::size_t i = 0; i < reused; ++i) {
      names[i].id = static_cast<std::int64_t>(pool[2 * i]);
      names[i].first_sequence = pool[2 * i + 1];
    }
    return Words(pool.begin() + static_cast<std::ptrdiff_t>(2 * reused), pool.end());
  });
  if (reused == count) co_return names;
  const auto fresh = static_cast<std::int64_t>(count - reused);
  const std::int64_t after = co_await store.add(std::string(kFreshIdCounter), fresh);
  for (std::size_t i = reused; i < count; ++i) {
    names[i].id = kFirstSplitId + after - fresh + static_cast<std::int64_t>(i - reused);
  }
  co_return names;
}

}  // namespace braid::collectives::detail
