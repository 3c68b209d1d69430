// SharedMemoryArena: a POSIX shared-memory segment that the members of a communicator on
// one node map, for collectives that move data through memory instead of messages.
//
// Why: between processes on one node UCX 1.13 copies every byte twice through its
// shared-memory FIFO (no zero-copy lane for error-handling endpoints), and a ring
// all-reduce sends each byte 2(P-1)/P times. Through a segment every rank copies its
// input in once, reduces 1/P of the vector reading every rank's copy, and copies the
// result out once: about five bytes of memory traffic per input byte, whatever P.
//
// Better still, where the kernel allows cross-memory attach (cross_memory.hpp), the
// segment carries only each rank's record of the operation (its buffers' addresses, size
// and process) and the flags, and ranks read each other's buffers directly: the reduction
// reads peers' blocks once, and the result is copied once into each rank's buffer.
//
// Layout: a header of per-rank flags (each on its own cache line), a line per rank where
// it counts its waiters asleep on its doorbell (doorbell.hpp), a line per rank counting
// the claimed pieces of its block of a single-copy all-reduce, a line per rank holding
// its computing hint (Communicator::set_computing), per-rank records (two
// cache lines each), then one staging slot of kSlotBytes per rank, then a result area of
// kSlotBytes. The segment is created by the first operation that needs it (rank 0 creates
// and names it, the others map it and say so, rank 0 unlinks the name), so a crash never
// leaves it behind in /dev/shm.
//
// Operations using the arena run one at a time, in the order they were issued (tickets
// handed out at the call, like sequence numbers), and only on the runtime thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "collectives/collective_call.hpp"
#include "collectives/doorbell.hpp"
#include "collectives/huge_page_advice.hpp"
#include "collectives/path_timings.hpp"
#include "collectives/shared_buffers.hpp"
#include "collectives/shared_segment.hpp"

namespace braid::collectives::detail {

// What a rank tells the others about itself and its current operation. Written by its
// rank before raising a flag, read by the others after seeing it (so plain fields).
struct alignas(64) RankRecord {
  // Set once, when the arena is mapped.
  std::int32_t pid;
  std::uint16_t reads_peers;        // 1: its probe read every peer's memory, and it may
  std::uint16_t all_reduce_direct;  // when it wants all-reduce to read peers (AllReduceDirect)
  std::uint64_t probe;              // address of a word holding kProbeValue in its process
  std::int32_t doorbell;            // its eventfd's number in its process (-1: none)
  std::int32_t rings_peers;         // 1: it took a descriptor of every peer's doorbell
  // Per operation.
  std::uint64_t input;  // buffer addresses in its process
  std::uint64_t output;
  // Where they lie in memory from Communicator::allocate_shared (shared_buffers.hpp): the
  // allocation (0: none) and the offset into this rank's region. Where every rank's lie in
  // one allocation, ranks reach each other's buffers through their own mappings.
  std::uint64_t shared_input;
  std::uint64_t shared_input_offset;
  std::uint64_t shared_output;
  std::uint64_t shared_output_offset;
  // Rank 0's: the way this all-reduce goes, where the way is measured
  // (SharedMemoryArena::kThroughSegment or kReadingPeers); every rank follows it.
  std::uint32_t all_reduce_path;
  // all_to_all_v, where each rank's counts are its own: the address of its send counts
  // (size_t[P], read by each receiver to find its piece), and, after the check, the first
  // sender whose count for it differs from what it expects (-1: none).
  std::uint64_t send_counts;
  std::int32_t disputed_sender;
  std::uint64_t disputed_sent;
  std::uint64_t disputed_expected;
};

// A small input and its call, for the collectives that take one wait when small
// (algorithms/shared_memory_inline.cpp); SharedMemoryArena::kInlineDepth per rank, used in
// turn by generation.
//
// The first cache line holds the whole of a tiny operation: the generation it was posted
// in (written last), its fingerprint, and a vector of up to kLineBytes. A peer waits on
// that word and finds the rest in the line it has just fetched: one cache-line transfer
// per peer where a flag, a fingerprint and a vector on three lines took three, each a
// miss that waits for the last (8-byte all-reduce, 2 ranks: see shared_memory_inline.cpp).
struct alignas(64) InlineSlot {
  static constexpr std::size_t kLineBytes = 64 - sizeof(std::uint64_t) - sizeof(Fingerprint);
  // A vector of up to this many bytes (SharedMemoryArena::kInlineBytes) ...
  static constexpr std::size_t kVectorBytes = std::size_t{64} << 10;
  // ... and room beside it for all_to_all_v's send and receive counts (to 255 ranks), so
  // that its 64 KiB inputs fit as the other collectives' do.
  static constexpr std::size_t kCountsBytes = 4096;

  std::uint64_t posted;  // the generation whose call this slot holds (atomic_ref)
  // What every rank must agree on before anyone reads another's buffer: every path posts
  // it here, so ranks whose counts put them on different paths still compare calls.
  Fingerprint call;
  std::byte in_line[kLineBytes];
  alignas(64) std::byte data[kVectorBytes + kCountsBytes];

  // Where a vector of `bytes` goes: every rank agrees, as their calls match.
  std::byte* vector(std::size_t bytes) noexcept { return bytes <= kLineBytes ? in_line : data; }
};
static_assert(offsetof(InlineSlot, data) == 64, "a tiny operation fits one cache line");

// Flags: the last generation a rank reached in each stage of an operation.
enum class Stage : int {
  posted = 0,    // its record describes the current operation
  arrived = 1,   // copy-through: its chunk is in its slot
  reduced = 2,   // its share of the reduction is done
  released = 3,  // it no longer reads anyone's memory for this operation
};

// When to read peers' memory directly (BRAID_SHM_SINGLE_COPY). The collectives but
// all-reduce have only messages to fall back on, and their single copy is about 2x faster
// even on a crowded node: they read peers whenever the kernel lets them. All-reduce can
// copy through the segment instead, and which of the two wins swings with the phases of
// the machine (path_timings.hpp): from kMeasuredFrom, by default, each operation takes
// the way rank 0's timings of recent operations of its size favour.
enum class SingleCopy {
  never,             // 0
  measured,          // auto
  whenever_allowed,  // 1: all-reduce too, at every size past the inline slots
};
// Reads BRAID_SHM_SINGLE_COPY; a malformed value is an Error(invalid_environment).
SingleCopy single_copy_from_environment();
// Reads BRAID_SHM_DOORBELL: whether shared-memory waits may sleep on doorbells
// (doorbell.hpp) rather than nap; a malformed value is an Error(invalid_environment).
bool doorbells_from_environment();
// CPUs this process may run on (its affinity mask).
int usable_cpus() noexcept;

class SharedMemoryArena {
 public:
  static constexpr std::size_t kSlotBytes = std::size_t{2} << 20;
  static constexpr std::size_t kInlineBytes = InlineSlot::kVectorBytes;
  static constexpr std::size_t kFlagStride = 64;
  static constexpr int kStages = 4;
  // The flags' rows, one of asleep counts, one of claim counters (claims()), and one of
  // computing hints (computing()).
  static constexpr int kAsleepRow = kStages;
  static constexpr int kClaimRow = kStages + 1;
  static constexpr int kComputingRow = kStages + 2;
  static constexpr int kFlagRows = kStages + 3;
  static constexpr std::uint64_t kProbeValue = 0x627261696450524fULL;  // "braidPRO"
  // Inline slots per rank. A rank may write one only once every rank is done with its
  // previous use, this many generations back: after a small rooted collective, which does
  // not wait for all, the sending end may run this many minus one ahead of the slowest
  // receiver before it waits. Back-to-back 8-byte broadcasts on the dev VM, 2 slots / 4 /
  // 8: 2 ranks 0.6 / 0.31 / 0.29 us, 4 ranks on the 2 cores 3.7 / 1.5 / 1.1 us (gather:
  // 0.64 / 0.39 / 0.34 and 2.8 / 1.7 / 1.1-1.5 us). A slot is 68 KiB, but only the lines
  // an operation writes are ever touched: tiny operations use one line of each.
  static constexpr int kInlineDepth = 8;

  // `doorbells`: whether waits may sleep on doorbells (BRAID_SHM_DOORBELL), where every
  // rank can ring every other.
  SharedMemoryArena(int ranks, SingleCopy policy, bool doorbells = true)
      : ranks_(ranks), policy_(policy), doorbells_wanted_(doorbells) {}
  SharedMemoryArena(const SharedMemoryArena&) = delete;
  SharedMemoryArena& operator=(const SharedMemoryArena&) = delete;

  std::size_t segment_bytes() const noexcept;
  bool mapped() const noexcept { return base_ != nullptr; }
  // Rank 0: creates the segment under a fresh name and maps it; returns the name.
  std::string create();
  // The others: maps the segment rank 0 created.
  void open(const std::string& name);
  // Rank 0, once every rank has mapped it: removes the name (the mappings stay).
  void unlink_name() noexcept { segment_.unlink_name(); }
  // Where some rank could not map it: every rank lets it go, so that the next
  // collective tries again, all ranks alike.
  // (Only before publish_hints: a mapped arena is never unmapped, since set_computing
  // writes through base_ from other threads once hints are published.)
  void unmap() noexcept {
    hints_published_.store(false, std::memory_order_seq_cst);
    segment_ = SharedSegment();
    base_ = nullptr;
  }

  // Defined here, not out of line: the waits call them in their spin loops.
  std::atomic_ref<std::uint64_t> flag(int rank, Stage stage) noexcept {
    std::byte* at = line(static_cast<int>(stage), rank);
    return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(at));
  }
  // How many of rank's waiters sleep on its doorbell.
  std::uint32_t* asleep(int rank) noexcept {
    return reinterpret_cast<std::uint32_t*>(line(kAsleepRow, rank));
  }
  // How many pieces of rank's block of the current single-copy all-reduce some rank has
  // claimed to reduce, tagged with the operation's generation (ArenaTurn::claim_piece).
  std::atomic_ref<std::uint64_t> claims(int rank) noexcept {
    return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(line(kClaimRow, rank)));
  }
  // Whether rank said it is computing (Communicator::set_computing): nonzero while it is.
  std::atomic_ref<std::uint32_t> computing(int rank) noexcept {
    return std::atomic_ref<std::uint32_t>(
        *reinterpret_cast<std::uint32_t*>(line(kComputingRow, rank)));
  }
  // This rank's hint, from any thread: kept here and, once the segment is mapped, in its
  // line, where peers read it; a change rings this rank's own doorbell, so that a wait
  // that depends on it (a single-copy all-reduce deferring to free ranks) looks again.
  void set_computing(bool computing) noexcept;
  bool computing_here() const noexcept { return computing_here_.load(std::memory_order_relaxed); }
  // Whether any rank's hint says it computes: then who reduces what depends on hints, and
  // an all-reduce's time says nothing about the path it took (ArenaTurn::post).
  bool any_computing() noexcept {
    for (int r = 0; r < ranks_; ++r) {
      if (computing(r).load(std::memory_order_relaxed) != 0) return true;
    }
    return false;
  }
  // Whether some peer's hint says it is not computing; with `reducing_in`, one that has
  // also not yet raised `reduced` in that generation: a free rank that may still take
  // this rank's share.
  static constexpr std::uint64_t kAnyGeneration = ~std::uint64_t{0};
  bool some_peer_free(std::uint64_t reducing_in = kAnyGeneration) noexcept {
    for (int r = 0; r < ranks_; ++r) {
      if (r != me_ && computing(r).load(std::memory_order_relaxed) == 0 &&
          flag(r, Stage::reduced).load(std::memory_order_acquire) < reducing_in) {
        return true;
      }
    }
    return false;
  }
  // Once mapped, by the runtime thread: this rank's number and its hint into the segment,
  // after which set_computing writes there directly.
  void publish_hints(int me) noexcept;
  RankRecord& record(int rank) noexcept { return reinterpret_cast<RankRecord*>(records())[rank]; }
  std::byte* slot(int rank) noexcept {
    return records() + static_cast<std::size_t>(ranks_) * sizeof(RankRecord) +
           static_cast<std::size_t>(rank) * kSlotBytes;
  }
  std::byte* result() noexcept { return slot(ranks_); }
  // Rank's inline slot for `generation`.
  InlineSlot& inline_slot(int rank, std::uint64_t generation) noexcept {
    std::byte* slots = slot(ranks_) + kSlotBytes;  // after the result area
    constexpr auto kDepth = static_cast<std::size_t>(kInlineDepth);
    const std::size_t index = kDepth * static_cast<std::size_t>(rank) + generation % kDepth;
    return reinterpret_cast<InlineSlot*>(slots)[index];
  }
  // The generation rank's inline slot for `generation` was last marked posted in.
  std::atomic_ref<std::uint64_t> inline_posted(int rank, std::uint64_t generation) noexcept {
    return std::atomic_ref<std::uint64_t>(inline_slot(rank, generation).posted);
  }

  // Issue order: a ticket at the call, served in order.
  std::uint64_t take_ticket() noexcept { return next_ticket_.fetch_add(1); }
  std::uint64_t serving() const noexcept { return serving_; }
  void done_serving() noexcept {
    ++serving_;
    if (doorbell_.armed()) doorbell_.turn_passed();  // operations may sleep awaiting it
  }
  // Where every rank took a descriptor of every other's doorbell (agreed when mapping),
  // waits sleep on it past their spin, and raising a flag rings the peers asleep.
  Doorbell& doorbell() noexcept { return doorbell_; }
  bool doorbells_wanted() const noexcept { return doorbells_wanted_; }
  Doorbell* armed_doorbell() noexcept { return doorbell_.armed() ? &doorbell_ : nullptr; }
  // The next generation (1, 2, ...), the same on every rank: one per operation's record,
  // one per chunk copied through the segment.
  std::uint64_t next_generation() noexcept { return ++generation_; }
  // Every member has reached this generation (posted in it, or got further), so none
  // still reads an inline slot of an earlier one: what a wait on every rank's flag or slot
  // teaches each rank that passes it (ArenaTurn::inline_slot_free).
  std::uint64_t all_reached() const noexcept { return all_reached_; }
  void note_all_reached(std::uint64_t generation) noexcept {
    all_reached_ = std::max(all_reached_, generation);
  }
  SingleCopy policy() const noexcept { return policy_; }
  // More members than usable CPUs (decided when mapping): waits must not spin long.
  bool crowded() const noexcept { return crowded_; }
  void set_crowded(bool crowded) noexcept { crowded_ = crowded; }
  // Whether every member reads every other's memory, and whether all-reduce does too
  // (agreed when mapping).
  bool single_copy() const noexcept { return single_copy_; }
  // Whether an all-reduce of `bytes` (per rank) reads peers directly: never, always, or
  // as measured (rank 0 chooses by its PathTimings and says so in its record). The same
  // answer on every rank, since what the members agreed and the size are.
  enum class AllReduceReads { segment, peers, measured };
  // Below this, always the segment: at 64 KiB it won in every phase measured (2 ranks:
  // 3.9-10 against 9.3 us), and a wrong guess costs more than a measurement saves.
  static constexpr std::size_t kMeasuredFrom = std::size_t{64} << 10;
  AllReduceReads single_copy_all_reduce(std::size_t bytes) const noexcept {
    if (!single_copy_) return AllReduceReads::segment;
    if (all_reduce_direct_ == AllReduceDirect::always) return AllReduceReads::peers;
    return bytes < kMeasuredFrom ? AllReduceReads::segment : AllReduceReads::measured;
  }
  // What each rank asks for all-reduce in its record when mapping; the members take the
  // most cautious answer.
  enum class AllReduceDirect : std::uint16_t {
    measured = 0,  // auto
    always = 1,    // BRAID_SHM_SINGLE_COPY=1
  };
  void set_single_copy(bool all_can, AllReduceDirect all_reduce) noexcept {
    single_copy_ = all_can;
    all_reduce_direct_ = all_reduce;
  }
  // Rank 0's timings of measured all-reduces (the others' go unused), of these two ways.
  static constexpr PathTimings::Path kThroughSegment = PathTimings::Path::first;
  static constexpr PathTimings::Path kReadingPeers = PathTimings::Path::second;
  PathTimings& all_reduce_timings() noexcept { return all_reduce_timings_; }
  // The memory allocate_shared handed out on this communicator.
  const std::shared_ptr<SharedBufferRegistry>& shared_buffers() const noexcept {
    return shared_buffers_;
  }
  // Where this process keeps kProbeValue, for peers to test reading it.
  std::uint64_t probe_address() const noexcept {
    return reinterpret_cast<std::uint64_t>(&probe_word_);
  }
  // Which of this rank's buffers to move onto huge pages for peers' cross-memory access.
  HugePageAdvice& huge_pages() noexcept { return huge_pages_; }
  // After a failed operation the flags no longer agree across ranks.
  bool broken() const noexcept { return broken_; }
  void mark_broken() noexcept { broken_ = true; }

 private:
  int ranks_;
  SingleCopy policy_;
  SharedSegment segment_;
  std::shared_ptr<SharedBufferRegistry> shared_buffers_ = std::make_shared<SharedBufferRegistry>();
  std::byte* base_ = nullptr;  // segment_.data()
  std::atomic<std::uint64_t> next_ticket_{0};
  std::uint64_t serving_ = 0;
  std::uint64_t generation_ = 0;
  std::uint64_t all_reached_ = 0;
  bool broken_ = false;
  bool single_copy_ = false;
  AllReduceDirect all_reduce_direct_ = AllReduceDirect::measured;
  PathTimings all_reduce_timings_;
  bool crowded_ = false;
  std::uint64_t probe_word_ = kProbeValue;
  HugePageAdvice huge_pages_;
  bool doorbells_wanted_;
  Doorbell doorbell_;
  // The computing hint: set from any thread (set_computing), published once mapped.
  std::atomic<bool> computing_here_{false};
  std::atomic<bool> hints_published_{false};
  int me_ = -1;
  // Copies computing_here_ into this rank's line until it stays what it read.
  void write_hint() noexcept;

  // Rank's cache line in row `row` of the header: the flags' rows (one per Stage), then
  // the asleep counts', the claim counters' and the computing hints'.
  std::byte* line(int row, int rank) noexcept {
    return base_ + (static_cast<std::size_t>(row) * static_cast<std::size_t>(ranks_) +
                    static_cast<std::size_t>(rank)) *
                       kFlagStride;
  }
  std::byte* records() noexcept { return line(kFlagRows, 0); }  // after the header's rows
};

}  // namespace braid::collectives::detail
