// Shared-memory all-reduce, for members on one node (shared_memory_arena.hpp). Every
// operation starts the same way: each rank writes its record (buffer addresses, bytes,
// dtype, reduce op) and raises `posted`; once all have, every rank checks that the others
// brought the same size, dtype and op, so a mismatch is an error on every rank, never a
// read past someone's buffer. Then one of two paths, the same on every rank:
//
// Single copy (the members may read each other's memory, cross_memory.hpp):
//   1. each rank reduces its 1/P block of the vector: it reads every peer's block into a
//      cache-sized scratch, a piece at a time, and folds it in (ranks in order 0..P-1, so
//      the result does not depend on who reduces), writing the result into its output;
//      raises `reduced`;
//   2. for each peer p that has raised `reduced`, it reads p's finished block straight
//      from p's output into its own; raises `released`;
//   3. it returns once every rank has released (nobody reads its buffers any more).
//   In place works: block i of a rank's buffer is read in step 1 only by rank i, and
//   overwritten in step 2 only after rank i raised `reduced`.
//   Cost (P ranks, n bytes): 3 flag waits, and per rank (P-1)/P n bytes read from peers
//   into cache, n/P read from its own input, n/P written, then (P-1)/P n bytes copied from
//   peers: about 2.5n bytes of memory traffic, half of copying through the segment.
//
// Copy through the segment (otherwise), in chunks of one slot (2 MiB). Per chunk, each
// rank:
//   1. copies its chunk into its slot and raises `arrived`;
//   2. once every rank has arrived, reduces its 1/P of the chunk across all P slots into
//      the result area (slot order fixed) and raises `reduced`;
//   3. once every rank has reduced, copies the whole chunk's result out.
//   Cost: 2 n/C flag waits (C the slot size), and per rank n bytes copied in, n read and
//   n/P written to reduce, n copied out: about 5n bytes of memory traffic.
//
// Flags carry generations, so they never need resetting, and the waits order every reuse
// of records, slots and the result area. The waits cost a few microseconds each, so small
// vectors stay with recursive doubling. The first use maps the arena (one name message
// and one acknowledgement per rank) and probes cross-memory attach (two flag waits).
#include "../cross_memory.hpp"
#include "../shared_memory_arena.hpp"
#include "algorithms.hpp"

#include <unistd.h>

#include <braid/core/error.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include <fmt/format.h>

namespace braid::collectives::detail {
namespace {

constexpr std::size_t kNameBytes = 128;
// Single copy reads peers' blocks in pieces this size, so the reduction reads them from
// cache (two pieces and the output's piece stay well inside a 2 MiB L2).
constexpr std::size_t kReadPieceBytes = std::size_t{256} << 10;

auto all_reached(SharedMemoryArena& arena, int world, Stage stage, std::uint64_t generation) {
  return [shared = &arena, world, stage, generation] {
    for (int r = 0; r < world; ++r) {
      if (shared->flag(r, stage).load(std::memory_order_acquire) < generation) return false;
    }
    return true;
  };
}

// Rank 0 creates the segment and sends its name; the others map it and acknowledge. Then
// every rank tests reading each peer's probe word, and single copy is used only if every
// rank could and its policy wants it.
asio::awaitable<void> map_arena(CollectiveOp& op, SharedMemoryArena& arena) {
  std::array<char, kNameBytes> name{};
  std::array<char, 1> ack{};
  if (op.rank() == 0) {
    const std::string created = arena.create();
    std::memcpy(name.data(), created.data(), std::min(created.size(), kNameBytes - 1));
    std::vector<Message> messages;
    for (int r = 1; r < op.size(); ++r) {
      messages.push_back(op.send(r, Buffer(name.data(), name.size(), DType::u8), 0));
    }
    std::vector<std::array<char, 1>> acks(static_cast<std::size_t>(op.size()));
    for (int r = 1; r < op.size(); ++r) {
      messages.push_back(op.recv(r, Buffer(acks[static_cast<std::size_t>(r)].data(), 1, DType::u8), 1));
    }
    co_await op.wait_all(messages);
    arena.unlink_name();  // every rank has it mapped
  } else {
    Message received = op.recv(0, Buffer(name.data(), name.size(), DType::u8), 0);
    co_await op.wait(received);
    arena.open(std::string(name.data()));
    Message sent = op.send(0, Buffer(ack.data(), ack.size(), DType::u8), 1);
    co_await op.wait(sent);
  }

  const int world = op.size();
  const int me = op.rank();
  const std::uint64_t generation = arena.next_generation();
  RankRecord& mine = arena.record(me);
  mine.pid = static_cast<std::int32_t>(getpid());
  mine.probe = arena.probe_address();
  arena.flag(me, Stage::posted).store(generation, std::memory_order_release);
  co_await op.poll_until(all_reached(arena, world, Stage::posted, generation),
                         "every rank's shared-memory record");
  bool reads_all = arena.policy() == SingleCopy::whenever_allowed ||
                   (arena.policy() == SingleCopy::unless_crowded && world <= usable_cpus());
  for (int r = 0; r < world && reads_all; ++r) {
    std::uint64_t word = 0;
    const RankRecord& peer = arena.record(r);
    reads_all = read_process_memory(peer.pid, peer.probe, &word, sizeof word) == 0 &&
                word == SharedMemoryArena::kProbeValue;
  }
  mine.reads_peers = reads_all ? 1 : 0;
  arena.flag(me, Stage::released).store(generation, std::memory_order_release);
  co_await op.poll_until(all_reached(arena, world, Stage::released, generation),
                         "every rank's cross-memory probe");
  bool all_can = true;
  for (int r = 0; r < world; ++r) all_can = all_can && arena.record(r).reads_peers == 1;
  arena.set_single_copy(all_can);
}

// Every rank reaches the same verdict from the same records; they pass one more flag
// before failing, so nobody overwrites its record while another still reads it.
asio::awaitable<void> check_agreement(CollectiveOp& op, SharedMemoryArena& arena,
                                      std::uint64_t generation) {
  const int world = op.size();
  const RankRecord& first = arena.record(0);
  for (int r = 1; r < world; ++r) {
    const RankRecord& other = arena.record(r);
    if (other.bytes == first.bytes && other.dtype == first.dtype &&
        other.reduce_op == first.reduce_op) {
      continue;
    }
    auto describe = [](const RankRecord& record) {
      return fmt::format("{} bytes of {} ({})", record.bytes,
                         to_string(static_cast<DType>(record.dtype)),
                         to_string(static_cast<ReduceOp>(record.reduce_op)));
    };
    // Read the records before releasing them: a rank that fails first may post its next
    // operation's record as soon as everyone has released.
    Error mismatch(Errc::size_mismatch,
                   fmt::format("rank {} brings {} but rank {} brings {}: counts or dtypes "
                               "differ across ranks",
                               op.world_rank(0), describe(first), op.world_rank(r),
                               describe(other)),
                   {.rank = op.world_rank(op.rank()), .peer = op.world_rank(op.rank() == 0 ? r : 0)});
    arena.flag(op.rank(), Stage::released).store(generation, std::memory_order_release);
    co_await op.poll_until(all_reached(arena, world, Stage::released, generation),
                           "every rank's check of the shared-memory records");
    throw mismatch;
  }
}

void read_from(CollectiveOp& op, int rank, std::uint64_t remote, void* local, std::size_t bytes,
               const RankRecord& record) {
  const int error = read_process_memory(record.pid, remote, local, bytes);
  if (error == 0) return;
  throw Error(std::error_code(error, std::generic_category()),
              fmt::format("cannot read rank {}'s buffer (process {}) through cross-memory attach",
                          op.world_rank(rank), record.pid),
              {.rank = op.world_rank(op.rank()), .peer = op.world_rank(rank)});
}

asio::awaitable<void> single_copy(CollectiveOp& op, Buffer input, Buffer output,
                                  ReduceOp reduce_op, SharedMemoryArena& arena,
                                  std::uint64_t generation) {
  const int world = op.size();
  const int me = op.rank();
  const DType dtype = input.dtype();
  const std::size_t element = dtype_size(dtype);
  const EvenSplit blocks{input.count(), static_cast<std::size_t>(world)};
  auto block_bytes = [&](int r) { return blocks.size(static_cast<std::size_t>(r)) * element; };
  auto block_offset = [&](int r) { return blocks.offset(static_cast<std::size_t>(r)) * element; };
  auto* in = static_cast<const std::byte*>(input.data());
  auto* out = static_cast<std::byte*>(output.data());

  {
    const trace::AsyncSpan reduce = op.phase("shared_memory.reduce", block_bytes(me));
    const std::size_t piece_elements = kReadPieceBytes / element;
    ScratchPool::Lease scratch = op.scratch(2 * piece_elements * element);
    std::byte* const landing[2] = {scratch.data(), scratch.data() + piece_elements * element};
    const std::size_t first = blocks.offset(static_cast<std::size_t>(me));
    const std::size_t length = blocks.size(static_cast<std::size_t>(me));
    for (std::size_t done = 0; done < length; done += piece_elements) {
      const std::size_t n = std::min(piece_elements, length - done);
      const std::size_t at = (first + done) * element;
      // Rank r's piece: our own input, or a peer's read into landing[which].
      auto piece = [&](int r, int which) -> const std::byte* {
        if (r == me) return in + at;
        read_from(op, r, arena.record(r).input + at, landing[which], n * element, arena.record(r));
        return landing[which];
      };
      // Accumulate in landing[0] until the last rank, whose fold writes the output: an
      // in-place output is our input, read for the last time in that same fold.
      const std::byte* accumulated = piece(0, 0);
      for (int r = 1; r < world; ++r) {
        const std::byte* next = piece(r, 1);
        std::byte* into = r == world - 1 ? out + at : landing[0];
        combine(Buffer(into, n, dtype), Buffer(const_cast<std::byte*>(accumulated), n, dtype),
                Buffer(const_cast<std::byte*>(next), n, dtype), reduce_op);
        accumulated = into;
      }
    }
    if (length != 0) finish_average(Buffer(out + first * element, length, dtype), reduce_op, world);
  }
  arena.flag(me, Stage::reduced).store(generation, std::memory_order_release);

  // Gather the finished blocks, starting after our own so the ranks spread their reads.
  for (int step = 1; step < world; ++step) {
    const int peer = (me + step) % world;
    co_await op.poll_until(
        [&arena, peer, generation] {
          return arena.flag(peer, Stage::reduced).load(std::memory_order_acquire) >= generation;
        },
        "a peer's share of the reduction");
    const trace::AsyncSpan gather = op.phase("shared_memory.gather", block_bytes(peer));
    if (block_bytes(peer) != 0) {
      read_from(op, peer, arena.record(peer).output + block_offset(peer), out + block_offset(peer),
                block_bytes(peer), arena.record(peer));
    }
  }
  arena.flag(me, Stage::released).store(generation, std::memory_order_release);
  co_await op.poll_until(all_reached(arena, world, Stage::released, generation),
                         "every rank's copy of the result");
}

asio::awaitable<void> copy_through_segment(CollectiveOp& op, Buffer input, Buffer output,
                                           ReduceOp reduce_op, SharedMemoryArena& arena) {
  const int world = op.size();
  const int me = op.rank();
  const DType dtype = input.dtype();
  const std::size_t element = dtype_size(dtype);
  const std::size_t chunk_elements = SharedMemoryArena::kSlotBytes / element;
  for (std::size_t offset = 0; offset < input.count(); offset += chunk_elements) {
    const std::size_t n = std::min(chunk_elements, input.count() - offset);
    const trace::AsyncSpan chunk = op.phase("shared_memory.chunk", n * element);
    const std::uint64_t generation = arena.next_generation();
    std::memcpy(arena.slot(me), static_cast<const std::byte*>(input.data()) + offset * element,
                n * element);
    arena.flag(me, Stage::arrived).store(generation, std::memory_order_release);
    co_await op.poll_until(all_reached(arena, world, Stage::arrived, generation),
                           "every rank's copy into shared memory");
    const EvenSplit parts{n, static_cast<std::size_t>(world)};
    const std::size_t first = parts.offset(static_cast<std::size_t>(me));
    const std::size_t length = parts.size(static_cast<std::size_t>(me));
    auto part_of = [&](std::byte* base) { return Buffer(base + first * element, length, dtype); };
    if (length != 0) {
      const Buffer result = part_of(arena.result());
      combine(result, part_of(arena.slot(0)), part_of(arena.slot(1)), reduce_op);
      for (int r = 2; r < world; ++r) combine(result, result, part_of(arena.slot(r)), reduce_op);
      finish_average(result, reduce_op, world);
    }
    arena.flag(me, Stage::reduced).store(generation, std::memory_order_release);
    co_await op.poll_until(all_reached(arena, world, Stage::reduced, generation),
                           "every rank's share of the reduction");
    std::memcpy(static_cast<std::byte*>(output.data()) + offset * element, arena.result(),
                n * element);
  }
}

}  // namespace

asio::awaitable<void> shared_memory_all_reduce(CollectiveOp& op, Buffer input, Buffer output,
                                               ReduceOp reduce_op, SharedMemoryArena& arena,
                                               std::uint64_t ticket) {
  const int world = op.size();
  const int me = op.rank();
  const Buffer in = input;
  const Buffer out = output;
  const std::uint64_t my_ticket = ticket;
  SharedMemoryArena* shared = &arena;
  trace::AsyncSpan turn = op.phase("shared_memory.wait_turn");
  co_await op.poll_until([shared, my_ticket] { return shared->serving() == my_ticket || shared->broken(); },
                         "the communicator's previous shared-memory operation");
  struct Served {
    SharedMemoryArena* arena;
    bool ok = false;
    ~Served() {
      if (!ok) arena->mark_broken();
      arena->done_serving();
    }
  } served{shared};
  turn.end();
  if (shared->broken()) {
    throw Error(Errc::peer_failed,
                "an earlier shared-memory collective on this communicator failed, so its ranks "
                "no longer agree on the arena's state",
                {.rank = op.world_rank(me)});
  }
  if (world == 1) {
    copy(out, in);
    served.ok = true;
    co_return;
  }
  if (!shared->mapped()) co_await map_arena(op, *shared);

  const std::uint64_t generation = shared->next_generation();
  RankRecord& mine = shared->record(me);
  mine.input = reinterpret_cast<std::uint64_t>(in.data());
  mine.output = reinterpret_cast<std::uint64_t>(out.data());
  mine.bytes = in.size_bytes();
  mine.dtype = static_cast<std::uint32_t>(in.dtype());
  mine.reduce_op = static_cast<std::uint32_t>(reduce_op);
  shared->flag(me, Stage::posted).store(generation, std::memory_order_release);
  co_await op.poll_until(all_reached(*shared, world, Stage::posted, generation),
                         "every rank's shared-memory record");
  try {
    co_await check_agreement(op, *shared, generation);
  } catch (const Error&) {
    served.ok = true;  // every rank failed at the same point: the arena is still in step
    throw;
  }
  if (shared->single_copy()) {
    co_await single_copy(op, in, out, reduce_op, *shared, generation);
  } else {
    co_await copy_through_segment(op, in, out, reduce_op, *shared);
  }
  served.ok = true;
}

}  // namespace braid::collectives::detail
