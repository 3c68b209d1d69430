#include "arena_turn.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>
#include <braid/core/log.hpp>

#include "../cross_memory.hpp"

namespace braid::collectives::detail {
namespace {

// fold_block reads peers' elements in pieces this size, so the reduction reads them from
// cache (two pieces and the output's piece stay well inside a 2 MiB L2).
constexpr std::size_t kFoldPieceBytes = std::size_t{256} << 10;

}  // namespace

ArenaTurn::~ArenaTurn() {
  if (!served_) return;
  if (!finished_) arena_.mark_broken();
  arena_.done_serving();
}

asio::awaitable<void> ArenaTurn::wait_turn() {
  const trace::AsyncSpan turn = op_.waiting("shared_memory.wait_turn");
  SharedMemoryArena* shared = &arena_;
  const std::uint64_t ticket = ticket_;
  co_await op_.poll_until(
      [shared, ticket] { return shared->serving() == ticket || shared->broken(); },
      "the communicator's previous shared-memory operation", kSpinWindow, shared->crowded(),
      shared->armed_doorbell(), CollectiveOp::Wake::turn);
  served_ = true;
}

asio::awaitable<void> ArenaTurn::start() {
  // Usually the turn has come (the operations before this one are done): then no wait,
  // and no trace span for one.
  if (arena_.serving() == ticket_) {
    served_ = true;
  } else {
    co_await wait_turn();
  }
  if (arena_.broken()) {
    throw Error(Errc::peer_failed,
                "an earlier shared-memory collective on this communicator failed, so its ranks "
                "no longer agree on the arena's state",
                {.rank = op_.world_rank(op_.rank())});
  }
  if (!arena_.mapped() && op_.size() > 1) co_await map();
}

asio::awaitable<void> ArenaTurn::pass() {
  co_await wait_turn();
  finished_ = true;
}

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
// GCC 12 reports its own coroutine frame's deallocation as mismatched here (GCC bug
// 109224, a false positive; braid-bench is built without the warning for the same reason).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
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
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

asio::awaitable<void> ArenaTurn::post(const Fingerprint& call, const Buffer& input,
                                      const Buffer& output) {
  generation_ = arena_.next_generation();
  RankRecord& mine = arena_.record(op_.rank());
  mine.input = reinterpret_cast<std::uint64_t>(input.data());
  mine.output = reinterpret_cast<std::uint64_t>(output.data());
  const SharedBufferRegistry& shared = *arena_.shared_buffers();
  const SharedBufferRegistry::Location in =
      shared.locate(input.data(), input.size_bytes(), op_.rank());
  const SharedBufferRegistry::Location out =
      shared.locate(output.data(), output.size_bytes(), op_.rank());
  mine.shared_input = in.id;
  mine.shared_input_offset = in.offset;
  mine.shared_output = out.id;
  mine.shared_output_offset = out.offset;
  // Peers may be about to pin this rank's pages (cross-memory attach), unless the buffers
  // are in allocate_shared memory, which they map: note() moves them onto huge pages at
  // their second use, so that pinning takes one page per 2 MiB.
  using Reads = SharedMemoryArena::AllReduceReads;
  using Path = PathTimings::Path;
  const bool all_reduce = call.kind == static_cast<std::uint8_t>(CollectiveKind::all_reduce);
  const Reads reads =
      all_reduce ? arena_.single_copy_all_reduce(input.size_bytes()) : Reads::segment;
  const bool attached = all_reduce ? reads != Reads::segment : arena_.single_copy();
  HugePageAdvice& huge_pages = arena_.huge_pages();
  const bool separate_output = output.data() != input.data();
  if (attached && in.id == 0) huge_pages.note(input.data(), input.size_bytes());
  if (attached && out.id == 0 && separate_output) {
    huge_pages.note(output.data(), output.size_bytes());
  }
  // Where the way is measured, rank 0 chooses it for all.
  if (reads == Reads::measured && op_.rank() == 0) {
    mine.all_reduce_path =
        static_cast<std::uint32_t>(arena_.all_reduce_timings().choose(input.size_bytes()));
  }
  // Every rank's fingerprint goes in its inline slot of the generation, whichever path its
  // counts put it on (shared_memory_inline.cpp), so all compare the same calls; records
  // would not do, as a rank that returned without waiting (a small rooted collective's
  // sending end) may rewrite its record in its next operation while we still read it.
  if (!inline_slot_free()) co_await wait_inline_slot_free();
  arena_.inline_slot(op_.rank(), generation_).call = call;
  post_inline_slot();
  all_posted_ = false;
  raise(Stage::posted);
  co_await wait_all(Stage::posted, "every rank's shared-memory record");
  all_posted_ = true;
  if (!calls_agree()) co_await fail_on_disagreement();
  // Every rank decides alike, from the same records: each rank whose buffers lie in
  // allocation n has it registered, so if all name the same n, all map it.
  bool one_allocation = mine.shared_input != 0 && mine.shared_output != 0;
  for (int r = 0; r < op_.size() && one_allocation; ++r) {
    one_allocation = arena_.record(r).shared_input == mine.shared_input &&
                     arena_.record(r).shared_output == mine.shared_output;
  }
  if (one_allocation) {
    mapped_input_ = in.view;
    mapped_output_ = out.view;
  }
  all_reduce_reads_peers_ = reads == Reads::peers;
  if (reads == Reads::measured) {
    const auto path = static_cast<Path>(arena_.record(0).all_reduce_path);
    all_reduce_reads_peers_ = path == SharedMemoryArena::kReadingPeers;
    // Mapped buffers read peers whatever was chosen: no measurement of either way. Nor
    // while a rank computes: reading peers then waits for, or does, others' shares.
    if (op_.rank() == 0 && !one_allocation && !arena_.any_computing()) {
      timed_ = true;
      timed_path_ = path;
      timed_since_ = std::chrono::steady_clock::now();
    }
  }
}

void ArenaTurn::all_reduce_done(std::size_t bytes) noexcept {
  if (!timed_) return;
  const auto took = std::chrono::steady_clock::now() - timed_since_;
  arena_.all_reduce_timings().record(bytes, timed_path_,
                                     std::chrono::duration_cast<std::chrono::nanoseconds>(took));
}

const Fingerprint& ArenaTurn::posted_call(int rank) noexcept {
  return arena_.inline_slot(rank, generation_).call;
}

bool ArenaTurn::calls_agree() noexcept {
  const Fingerprint& first = posted_call(0);
  for (int r = 1; r < op_.size(); ++r) {
    if (!(posted_call(r) == first)) return false;
  }
  return true;
}

Error ArenaTurn::dispute(int a, int b) noexcept {
  const int me = op_.rank();
  return Error(Errc::size_mismatch,
               fmt::format("rank {} calls {} but rank {} calls {}: counts or dtypes differ "
                           "across ranks",
                           op_.world_rank(a), describe(posted_call(a)), op_.world_rank(b),
                           describe(posted_call(b))),
               {.rank = op_.world_rank(me), .peer = op_.world_rank(me == a ? b : a)});
}

asio::awaitable<void> ArenaTurn::fail_on_disagreement() {
  const Fingerprint& first = posted_call(0);
  for (int r = 1; r < op_.size(); ++r) {
    if (posted_call(r) == first) continue;
    // Every rank reaches this verdict from the same fingerprints. Word it before releasing
    // them: a rank that fails first may post its next record once everyone has released.
    Error mismatch = dispute(0, r);
    co_await release();
    finish();  // every rank fails at the same point: the arena is still in step
    throw mismatch;
  }
  BRAID_ENFORCE(false, "fail_on_disagreement called where every rank posted the same call");
}

asio::awaitable<void> ArenaTurn::release() {
  raise(Stage::released);
  co_await wait_all(Stage::released, "every rank to finish reading shared buffers");
}

void ArenaTurn::raise(Stage stage) noexcept {
  arena_.flag(op_.rank(), stage).store(generation_, std::memory_order_release);
  if (Doorbell* doorbell = arena_.armed_doorbell()) doorbell->ring_sleepers();
}

namespace {

// A claim counter holds the generation's low 40 bits above the number of pieces claimed
// (24 bits): a value tagged with an earlier generation means none claimed yet. No rank
// claims in the next operation before every rank has posted it, which each does only
// after its last claim in this one, so a counter never holds a later generation.
constexpr int kClaimIndexBits = 24;
constexpr std::uint64_t kClaimIndexMask = (std::uint64_t{1} << kClaimIndexBits) - 1;

std::uint64_t claimed_in(std::uint64_t counter, std::uint64_t generation) noexcept {
  return (counter & ~kClaimIndexMask) == generation << kClaimIndexBits ? counter & kClaimIndexMask
                                                                       : 0;
}

}  // namespace

std::size_t ArenaTurn::claimed(int owner) noexcept {
  return claimed_in(arena_.claims(owner).load(std::memory_order_relaxed), generation_);
}

std::optional<std::size_t> ArenaTurn::claim_piece(int owner, std::size_t pieces) {
  BRAID_ENFORCE(pieces <= kClaimIndexMask, "an all-reduce block of {} pieces", pieces);
  const std::uint64_t tag = generation_ << kClaimIndexBits;
  std::atomic_ref<std::uint64_t> counter = arena_.claims(owner);
  std::uint64_t seen = counter.load(std::memory_order_relaxed);
  for (;;) {
    const std::uint64_t claimed = claimed_in(seen, generation_);
    if (claimed >= pieces) return std::nullopt;
    if (counter.compare_exchange_weak(seen, tag | (claimed + 1), std::memory_order_relaxed)) {
      return claimed;
    }
  }
}

// Not coroutines (the waits below): each returns poll_until's, one frame rather than two.
asio::awaitable<void> ArenaTurn::wait_all(Stage stage, std::string_view what) {
  SharedMemoryArena* shared = &arena_;
  const std::uint64_t generation = generation_;
  const int world = op_.size();
  return op_.poll_until(
      [shared, world, stage, generation] {
        for (int r = 0; r < world; ++r) {
          if (shared->flag(r, stage).load(std::memory_order_acquire) < generation) return false;
        }
        shared->note_all_reached(generation);
        return true;
      },
      what, spin_window(), arena_.crowded(), arena_.armed_doorbell());
}

bool ArenaTurn::peers_past_slot_use() noexcept {
  // The slot's last use, and the generation every rank must have reached since: at least
  // 1 here, for map() waited for every rank in generation 1.
  constexpr std::uint64_t kDepth = SharedMemoryArena::kInlineDepth;
  const std::uint64_t last_use = generation_ - kDepth;
  const std::uint64_t next = last_use + 1;
  const int me = op_.rank();
  for (int r = 0; r < op_.size(); ++r) {
    if (r == me) continue;
    const bool past = arena_.inline_posted(r, next).load(std::memory_order_acquire) >= next ||
                      arena_.flag(r, Stage::posted).load(std::memory_order_acquire) >= next ||
                      arena_.flag(r, Stage::released).load(std::memory_order_acquire) >= last_use;
    if (!past) return false;
  }
  arena_.note_all_reached(next);
  return true;
}

// The turn outlives its waits (its operation's frame holds both): the predicates below
// may keep `this`.
asio::awaitable<void> ArenaTurn::wait_inline_slot_free() {
  return op_.poll_until([this] { return peers_past_slot_use(); },
                        "every rank to finish reading this rank's inline slot's last use",
                        spin_window(), arena_.crowded(), arena_.armed_doorbell());
}

void ArenaTurn::post_inline_slot() noexcept {
  arena_.inline_posted(op_.rank(), generation_).store(generation_, std::memory_order_release);
  if (Doorbell* doorbell = arena_.armed_doorbell()) doorbell->ring_sleepers();
}

bool ArenaTurn::all_inline_slots_posted() noexcept {
  for (int r = 0; r < op_.size(); ++r) {
    if (arena_.inline_posted(r, generation_).load(std::memory_order_acquire) < generation_) {
      return false;
    }
  }
  arena_.note_all_reached(generation_);
  return true;
}

asio::awaitable<void> ArenaTurn::wait_all_inline_slots(std::string_view what) {
  return op_.poll_until([this] { return all_inline_slots_posted(); }, what, spin_window(),
                        arena_.crowded(), arena_.armed_doorbell());
}

bool ArenaTurn::inline_slot_posted(int rank) noexcept {
  if (arena_.inline_posted(rank, generation_).load(std::memory_order_acquire) < generation_) {
    return false;
  }
  // With one peer, the rank we waited for is every rank there is.
  if (op_.size() == 2) arena_.note_all_reached(generation_);
  return true;
}

asio::awaitable<void> ArenaTurn::wait_inline_slot(int rank, std::string_view what) {
  return op_.poll_until([this, rank] { return inline_slot_posted(rank); }, what, spin_window(),
                        arena_.crowded(), arena_.armed_doorbell());
}

const std::byte* ArenaTurn::mapped_input(int rank) noexcept {
  return mapped_input_.at(rank, arena_.record(rank).shared_input_offset);
}

std::byte* ArenaTurn::mapped_output(int rank) noexcept {
  return mapped_output_.at(rank, arena_.record(rank).shared_output_offset);
}

void ArenaTurn::read_input(int rank, std::size_t offset, void* into, std::size_t bytes) {
  if (mapped()) {
    std::memcpy(into, mapped_input(rank) + offset, bytes);
  } else {
    read(rank, arena_.record(rank).input + offset, into, bytes);
  }
}

void ArenaTurn::read_output(int rank, std::size_t offset, void* into, std::size_t bytes) {
  if (mapped()) {
    std::memcpy(into, mapped_output(rank) + offset, bytes);
  } else {
    read(rank, arena_.record(rank).output + offset, into, bytes);
  }
}

void ArenaTurn::read(int rank, std::uint64_t remote, void* into, std::size_t bytes) {
  const int error = read_process_memory(arena_.record(rank).pid, remote, into, bytes);
  if (error != 0) cross_memory_failed(rank, error, "read");
}

void ArenaTurn::write_output(int rank, std::size_t offset, const void* from, std::size_t bytes) {
  if (mapped()) {
    std::memcpy(mapped_output(rank) + offset, from, bytes);
    return;
  }
  const RankRecord& peer = arena_.record(rank);
  const int error = write_process_memory(peer.pid, peer.output + offset, from, bytes);
  if (error != 0) cross_memory_failed(rank, error, "write");
}

void ArenaTurn::cross_memory_failed(int rank, int error, std::string_view what) {
  if (error == ESRCH) {
    // Its process is gone: the same failure a dead peer is everywhere else.
    throw Error(
        Errc::peer_failed,
        fmt::format("rank {}'s process ({}) is gone; its buffer cannot be {}", op_.world_rank(rank),
                    arena_.record(rank).pid, what == "read" ? "read" : "written"),
        {.rank = op_.world_rank(op_.rank()), .peer = op_.world_rank(rank)});
  }
  throw Error(std::error_code(error, std::generic_category()),
              fmt::format("cannot {} rank {}'s buffer (process {}) through cross-memory attach",
                          what, op_.world_rank(rank), arena_.record(rank).pid),
              {.rank = op_.world_rank(op_.rank()), .peer = op_.world_rank(rank)});
}

void fold_block(ArenaTurn& turn, CollectiveOp& op, const Buffer& input, std::size_t first,
                std::size_t count, ReduceOp reduce_op, const FoldTarget& target) {
  const int world = op.size();
  const int me = op.rank();
  const DType dtype = input.dtype();
  const std::size_t element = dtype_size(dtype);
  const std::size_t piece_elements = kFoldPieceBytes / element;
  // Two landing pieces, and a third for the result when it has no place of ours.
  ScratchPool::Lease scratch =
      op.scratch((target.local == nullptr ? 3 : 2) * piece_elements * element);
  std::byte* const landing[2] = {scratch.data(), scratch.data() + piece_elements * element};
  std::byte* const result = scratch.data() + 2 * piece_elements * element;
  const auto* in = static_cast<const std::byte*>(input.data());
  for (std::size_t done = 0; done < count; done += piece_elements) {
    const std::size_t n = std::min(piece_elements, count - done);
    const std::size_t at = (first + done) * element;
    // Rank r's piece: our own input, a peer's through our mapping of it, or a peer's
    // read into landing[which].
    auto piece = [&](int r, int which) -> std::byte* {
      if (r == me) return const_cast<std::byte*>(in + at);
      if (turn.mapped()) return const_cast<std::byte*>(turn.mapped_input(r) + at);
      turn.read_input(r, at, landing[which], n * element);
      return landing[which];
    };
    std::byte* const destination = target.local != nullptr ? target.local + done * element : result;
    // Accumulate in landing[0] up to the last rank, whose fold writes the destination: an
    // in-place output is our input, read for the last time in that same fold.
    // The last fold divides an average as it writes.
    std::byte* accumulated = piece(0, 0);
    for (int r = 1; r < world; ++r) {
      std::byte* next = piece(r, 1);
      const Buffer a(accumulated, n, dtype), b(next, n, dtype);
      if (r == world - 1) {
        combine_and_finish(Buffer(destination, n, dtype), a, b, reduce_op, world);
      } else {
        combine(Buffer(landing[0], n, dtype), a, b, reduce_op);
      }
      accumulated = landing[0];
    }
    if (target.root >= 0 && target.root != me) {
      turn.write_output(target.root, at, destination, n * element);
    }
    if (target.every_peer) {
      // Only we read or write these elements of any rank's buffers (each piece is folded
      // by the one rank that claimed it): a peer's in-place input here was read above,
      // for the last time.
      for (int step = 1; step < world; ++step) {
        turn.write_output((me + step) % world, at, destination, n * element);
      }
    }
  }
}

}  // namespace braid::collectives::detail
