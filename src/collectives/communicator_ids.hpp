// Communicator ids: the 12 bits of every message tag that tell communicators apart
// (transport/tag.hpp), handed out by split and given back once every member has destroyed
// the communicator, so a job may create any number of communicators over its life as long
// as at most 4094 split ones are alive at once.
//
// Why ids are reused: a job that splits a new group now and then (per evaluation, per
// elastic resize, a library that splits per call) would otherwise run out after 4094
// splits in total, hours into training.
//
// How, through the store, so that no rank has to know the others' lifetimes:
//   - A destroyed communicator leaves a Release in its CommunicatorIds (shared by every
//     communicator split from one world communicator): its serial, id, member count, and
//     the first sequence number it never used.
//   - Each split first publishes the releases pending on its rank (publish_releases):
//     a per-serial record counts the members that let go and keeps the highest such
//     sequence; the member that completes the count puts (id, sequence) in the free pool.
//     A member that never splits again, or died, never completes it: the id then stays
//     taken, which is safe.
//   - Rank 0 of a split takes ids from the pool before drawing fresh ones (allocate), and
//     a communicator on a reused id numbers its operations from the sequence its last
//     user never reached: a message the old one left unmatched (a send nobody received,
//     an operation that failed half way) carries a sequence the new one does not use for
//     2^20 operations, so it is never taken for one of the new communicator's.
// Serials, unlike ids, are never reused: they name what belongs to one communicator in the
// store (its release record, its NCCL unique id).
//
// Cost, in store round trips per split: one or two (a compare-and-set that finds the record
// written since it last looked tries again) per communicator released on this rank since
// its last split, plus two or three more for the member that frees the id (one or two for
// the pool, one to erase the record); on rank 0, a serial counter, one or two for the
// pool, and a fresh-id counter when the pool runs short.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include <braid/transport/store/store.hpp>

namespace braid::collectives::detail {

namespace asio = boost::asio;

// The world communicator's id and serial; split ones start above.
inline constexpr std::uint32_t kWorldCommunicatorId = 1;
inline constexpr std::uint32_t kFirstSplitId = 2;

// What a split communicator leaves when it is destroyed on one rank.
struct Release {
  std::int64_t serial = 0;
  std::uint32_t id = 0;
  int members = 0;
  std::uint64_t unused_sequence = 0;  // above every sequence number this rank sent or awaited
};

// One new communicator's name, agreed by rank 0 of its split.
struct CommunicatorName {
  std::int64_t serial = 0;
  std::int64_t id = 0;               // may be >= max_communicators: the split then fails
  std::uint64_t first_sequence = 0;  // 0 for a fresh id
};

class CommunicatorIds {
 public:
  void released(const Release& release);
  std::vector<Release> take_released();
  // How many subgroups of these members this process made before (0, 1, ...): members
  // make theirs in the same order, so the count names the one being made alike on each.
  std::int64_t next_subgroup(const std::string& members);

 private:
  std::mutex mutex_;
  std::vector<Release> released_;
  std::map<std::string, std::int64_t> subgroups_;
};

// Counts this rank's releases in the store; the last member to let go frees the id.
asio::awaitable<void> publish_releases(transport::StoreClient& store, std::vector<Release> releases,
                                       int world_rank);

// `count` names for the communicators of one split (rank 0 of the parent calls it).
asio::awaitable<std::vector<CommunicatorName>> allocate_names(transport::StoreClient& store,
                                                              std::size_t count, int world_rank);

}  // namespace braid::collectives::detail
