// ArenaTurn::map() (arena_turn.hpp): the first operation that needs the arena maps it,
// and every rank probes what it can do with its peers: read their memory (single copy),
// ring their doorbells, and how all-reduce should read; all ranks agree on each.
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/core/log.hpp>

#include "collectives/algorithms/arena_turn.hpp"
#include "collectives/cross_memory.hpp"

namespace braid::collectives::detail {
namespace {

// Why this rank's shared-memory waits will poll instead of sleeping on a doorbell. Out of
// descriptors is worth a warning: each communicator's arena holds one per local peer plus
// its own, and a job that splits many communicators can reach the limit (ulimit -n).
void explain_no_doorbell(int error, const char* call) {
  if (error == EMFILE || error == ENFILE) {
    log::warn(
        "shared-memory doorbells: {} failed ({}): this communicator's waits poll "
        "instead of sleeping; raise the descriptor limit (ulimit -n)",
        call, std::strerror(error));
  } else {
    log::debug("shared-memory doorbells: {} failed ({}): this communicator's waits poll", call,
               std::strerror(error));
  }
}

// map()'s messages: rank 0's segment name (or why it could not make the segment), each
// rank's acknowledgement, and rank 0's verdict. `error` is an errno, 0 for success.
struct MapNotice {
  std::int32_t error = 0;
  std::int32_t rank = -1;        // whose failure this reports
  std::array<char, 120> text{};  // the segment's name, or the failure's message
};
static_assert(sizeof(MapNotice) == 128);

Buffer bytes_of(MapNotice& notice) {
  return Buffer(reinterpret_cast<std::uint8_t*>(&notice), sizeof notice, DType::u8);
}

// Copies `text` into the notice, cut to fit and NUL-terminated.
void put_text(MapNotice& notice, std::string_view text) {
  std::memcpy(notice.text.data(), text.data(), std::min(text.size(), notice.text.size() - 1));
}

// `action`'s notice, or, if it throws, `rank`'s failure notice (the whole message in
// `failure`: the notice carries what fits).
template <class Action>
MapNotice attempt(int rank, std::string& failure, Action action) {
  try {
    return action();
  } catch (const Error& error) {
    failure = error.detail();
    MapNotice notice;
    notice.error = error.code().category() == std::generic_category() ? error.code().value() : EIO;
    notice.rank = rank;
    put_text(notice, failure);
    return notice;
  }
}

// Rank 0 makes the segment: its name, or why not.
MapNotice create_segment(SharedMemoryArena& arena, std::string& failure) {
  return attempt(0, failure, [&arena] {
    MapNotice name;
    put_text(name, arena.create());
    return name;
  });
}

// Another rank maps it: an empty notice, or why not.
MapNotice open_segment(SharedMemoryArena& arena, const MapNotice& name, int rank,
                       std::string& failure) {
  return attempt(rank, failure, [&] {
    arena.open(std::string(name.text.data()));
    return MapNotice{};
  });
}

// What a rank throws when it could not make or map the segment itself.
[[noreturn]] void failed_here(const CollectiveOp& op, const MapNotice& notice,
                              const std::string& message) {
  throw Error(std::error_code(notice.error, std::generic_category()), message,
              {.rank = op.world_rank(op.rank())});
}

// What a rank throws when another (notice.rank) could not `what` the segment.
[[noreturn]] void failed_elsewhere(const CollectiveOp& op, const MapNotice& notice,
                                   std::string_view what) {
  throw Error(std::error_code(notice.error, std::generic_category()),
              fmt::format("rank {} could not {} the node's shared-memory segment ({})",
                          op.world_rank(notice.rank), what, std::string_view(notice.text.data())),
              {.rank = op.world_rank(op.rank()), .peer = op.world_rank(notice.rank)});
}

}  // namespace

// Rank 0 creates the segment and sends its name; the others map it and acknowledge, and
// rank 0 sends the verdict. A rank that cannot make or map the segment (a full
// /dev/shm) says so in its message instead, so every rank fails at once naming it rather
// than waiting out its deadline for a message that never comes; all let the segment go,
// and the communicator's next shared-memory collective tries again. Then every rank tests
// reading each peer's probe word, and single copy is used only if every rank could and
// its policy wants it.
asio::awaitable<void> ArenaTurn::map() {
  const int world = op_.size();
  const int me = op_.rank();
  if (me == 0) {
    std::string failure;
    MapNotice name = create_segment(arena_, failure);
    std::vector<Message> sends;
    for (int r = 1; r < world; ++r) sends.push_back(op_.send(r, bytes_of(name), 0));
    co_await op_.wait_all(sends);
    if (name.error != 0) {
      finish();  // in step: every rank fails here, none mapped
      failed_here(op_, name, failure);
    }
    std::vector<MapNotice> acks(static_cast<std::size_t>(world));
    std::vector<Message> receives;
    for (int r = 1; r < world; ++r) {
      receives.push_back(op_.recv(r, bytes_of(acks[static_cast<std::size_t>(r)]), 1));
    }
    co_await op_.wait_all(receives);
    MapNotice verdict;
    for (int r = 1; r < world && verdict.error == 0; ++r) {
      if (acks[static_cast<std::size_t>(r)].error != 0) verdict = acks[static_cast<std::size_t>(r)];
    }
    sends.clear();
    for (int r = 1; r < world; ++r) sends.push_back(op_.send(r, bytes_of(verdict), 2));
    co_await op_.wait_all(sends);
    arena_.unlink_name();  // every rank has it mapped, or will not
    if (verdict.error != 0) {
      arena_.unmap();
      finish();  // in step: every rank fails here, none mapped
      failed_elsewhere(op_, verdict, "map");
    }
  } else {
    MapNotice name;
    Message named = op_.recv(0, bytes_of(name), 0);
    co_await op_.wait(named);
    if (name.error != 0) {
      finish();
      failed_elsewhere(op_, name, "make");
    }
    std::string failure;
    MapNotice ack = open_segment(arena_, name, me, failure);
    MapNotice verdict;
    Message sent = op_.send(0, bytes_of(ack), 1);
    Message received = op_.recv(0, bytes_of(verdict), 2);
    co_await op_.wait(sent);
    co_await op_.wait(received);
    if (verdict.error != 0) {
      arena_.unmap();
      finish();
      if (ack.error != 0) failed_here(op_, ack, failure);
      failed_elsewhere(op_, verdict, "map");
    }
  }

  generation_ = arena_.next_generation();
  RankRecord& mine = arena_.record(op_.rank());
  mine.pid = static_cast<std::int32_t>(getpid());
  mine.probe = arena_.probe_address();
  Doorbell& doorbell = arena_.doorbell();
  mine.doorbell = -1;
  if (arena_.doorbells_wanted()) {
    mine.doorbell = doorbell.open();
    if (mine.doorbell < 0) explain_no_doorbell(errno, "eventfd");
  }
  raise(Stage::posted);
  co_await wait_all(Stage::posted, "every rank's shared-memory record");
  arena_.set_crowded(world > usable_cpus());
  const SingleCopy policy = arena_.policy();
  bool reads_all = policy != SingleCopy::never;
  for (int r = 0; r < world && reads_all; ++r) {
    std::uint64_t word = 0;
    const RankRecord& peer = arena_.record(r);
    const int refused = read_process_memory(peer.pid, peer.probe, &word, sizeof word);
    reads_all = refused == 0 && word == SharedMemoryArena::kProbeValue;
    if (refused != 0) {
      log::debug(
          "cross-memory attach to rank {} refused ({}): collectives on this "
          "communicator copy through shared memory or send messages",
          op_.world_rank(r), std::strerror(refused));
    }
  }
  mine.reads_peers = reads_all ? 1 : 0;
  bool rings_all = mine.doorbell >= 0;
  for (int r = 0; r < world && rings_all; ++r) {
    if (r == me) continue;
    const RankRecord& peer = arena_.record(r);
    if (peer.doorbell < 0) {  // that rank has said why
      rings_all = false;
    } else if (const int refused = doorbell.connect(r, peer.pid, peer.doorbell); refused != 0) {
      explain_no_doorbell(refused, "taking a peer's doorbell (pidfd_open, pidfd_getfd)");
      rings_all = false;
    }
  }
  mine.rings_peers = rings_all ? 1 : 0;
  using Direct = SharedMemoryArena::AllReduceDirect;
  const Direct wanted = policy == SingleCopy::whenever_allowed ? Direct::always : Direct::measured;
  mine.all_reduce_direct = static_cast<std::uint16_t>(wanted);
  raise(Stage::released);
  co_await wait_all(Stage::released, "every rank's cross-memory probe");
  bool all_can = true;
  bool all_ring = true;
  auto agreed = static_cast<std::uint16_t>(Direct::always);
  for (int r = 0; r < world; ++r) {
    all_can = all_can && arena_.record(r).reads_peers == 1;
    all_ring = all_ring && arena_.record(r).rings_peers == 1;
    agreed = std::min(agreed, arena_.record(r).all_reduce_direct);
  }
  arena_.set_single_copy(all_can, static_cast<Direct>(agreed));
  // A rank sleeps on its doorbell only where every peer can ring it.
  if (all_ring) {
    std::vector<std::uint32_t*> asleep;
    for (int r = 0; r < world; ++r) asleep.push_back(arena_.asleep(r));
    doorbell.arm(me, std::move(asleep));
  }
  arena_.publish_hints(me);
}

}  // namespace braid::collectives::detail
