// Shared-memory all-reduce, for members on one node (shared_memory_arena.hpp). The vector
// goes through the arena in chunks of one slot (2 MiB). Per chunk, each rank:
//   1. copies its chunk into its slot and raises its `arrived` flag;
//   2. once every rank has arrived, reduces its 1/P of the chunk across all P slots into
//      the result area (slot order fixed, so every element is reduced the same way on
//      whichever rank does it) and raises its `reduced` flag;
//   3. once every rank has reduced, copies the whole chunk's result out.
// The flags carry the chunk's generation, so they never need resetting, and the two
// waits per chunk order every reuse of slots and result area (see the .hpp).
//
// Cost (P ranks on one node, n bytes): 2 n/C flag waits (C the slot size), and per rank
// n bytes copied in, n read and n/P written to reduce, n copied out: about 5n bytes of
// memory traffic, independent of P, against ring's 2(P-1)/P n bytes sent, each copied
// twice through UCX's shared-memory FIFO. The waits cost a few microseconds each, so
// small vectors stay with recursive doubling. The first use creates the arena: one name
// message and one acknowledgement per rank.
#include "../shared_memory_arena.hpp"
#include "algorithms.hpp"

#include <braid/core/error.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

namespace braid::collectives::detail {
namespace {

constexpr std::size_t kNameBytes = 128;

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
    co_return;
  }
  Message received = op.recv(0, Buffer(name.data(), name.size(), DType::u8), 0);
  co_await op.wait(received);
  arena.open(std::string(name.data()));
  Message sent = op.send(0, Buffer(ack.data(), ack.size(), DType::u8), 1);
  co_await op.wait(sent);
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

  const DType dtype = in.dtype();
  const std::size_t element = dtype_size(dtype);
  const std::size_t chunk_elements = SharedMemoryArena::kSlotBytes / element;
  for (std::size_t offset = 0; offset < in.count(); offset += chunk_elements) {
    const std::size_t n = std::min(chunk_elements, in.count() - offset);
    const trace::AsyncSpan chunk = op.phase("shared_memory.chunk", n * element);
    const std::uint64_t generation = shared->next_generation();
    std::memcpy(shared->slot(me), static_cast<const std::byte*>(in.data()) + offset * element,
                n * element);
    shared->flag(me, 0).store(generation, std::memory_order_release);
    auto all_reached = [shared, world, generation](int which) {
      return [shared, world, generation, which] {
        for (int r = 0; r < world; ++r) {
          if (shared->flag(r, which).load(std::memory_order_acquire) < generation) return false;
        }
        return true;
      };
    };
    co_await op.poll_until(all_reached(0), "every rank's copy into shared memory");
    const EvenSplit parts{n, static_cast<std::size_t>(world)};
    const std::size_t first = parts.offset(static_cast<std::size_t>(me));
    const std::size_t length = parts.size(static_cast<std::size_t>(me));
    auto part_of = [&](std::byte* base) { return Buffer(base + first * element, length, dtype); };
    if (length != 0) {
      const Buffer result = part_of(shared->result());
      combine(result, part_of(shared->slot(0)), part_of(shared->slot(1)), reduce_op);
      for (int r = 2; r < world; ++r) combine(result, result, part_of(shared->slot(r)), reduce_op);
      finish_average(result, reduce_op, world);
    }
    shared->flag(me, 1).store(generation, std::memory_order_release);
    co_await op.poll_until(all_reached(1), "every rank's share of the reduction");
    std::memcpy(static_cast<std::byte*>(out.data()) + offset * element, shared->result(),
                n * element);
  }
  served.ok = true;
}

}  // namespace braid::collectives::detail
