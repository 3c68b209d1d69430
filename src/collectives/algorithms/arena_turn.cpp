#include "arena_turn.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include <braid/core/error.hpp>

#include "../cross_memory.hpp"

namespace braid::collectives::detail {
namespace {

constexpr std::size_t kNameBytes = 128;
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
  const trace::AsyncSpan turn = op_.phase("shared_memory.wait_turn");
  SharedMemoryArena* shared = &arena_;
  const std::uint64_t ticket = ticket_;
  co_await op_.poll_until(
      [shared, ticket] { return shared->serving() == ticket || shared->broken(); },
      "the communicator's previous shared-memory operation");
  served_ = true;
}

asio::awaitable<void> ArenaTurn::start() {
  co_await wait_turn();
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

// Rank 0 creates the segment and sends its name; the others map it and acknowledge. Then
// every rank tests reading each peer's probe word, and single copy is used only if every
// rank could and its policy wants it.
asio::awaitable<void> ArenaTurn::map() {
  std::array<char, kNameBytes> name{};
  std::array<char, 1> ack{};
  if (op_.rank() == 0) {
    const std::string created = arena_.create();
    std::memcpy(name.data(), created.data(), std::min(created.size(), kNameBytes - 1));
    std::vector<Message> messages;
    for (int r = 1; r < op_.size(); ++r) {
      messages.push_back(op_.send(r, Buffer(name.data(), name.size(), DType::u8), 0));
    }
    std::vector<std::array<char, 1>> acks(static_cast<std::size_t>(op_.size()));
    for (int r = 1; r < op_.size(); ++r) {
      messages.push_back(
          op_.recv(r, Buffer(acks[static_cast<std::size_t>(r)].data(), 1, DType::u8), 1));
    }
    co_await op_.wait_all(messages);
    arena_.unlink_name();  // every rank has it mapped
  } else {
    Message received = op_.recv(0, Buffer(name.data(), name.size(), DType::u8), 0);
    co_await op_.wait(received);
    arena_.open(std::string(name.data()));
    Message sent = op_.send(0, Buffer(ack.data(), ack.size(), DType::u8), 1);
    co_await op_.wait(sent);
  }

  const int world = op_.size();
  generation_ = arena_.next_generation();
  RankRecord& mine = arena_.record(op_.rank());
  mine.pid = static_cast<std::int32_t>(getpid());
  mine.probe = arena_.probe_address();
  raise(Stage::posted);
  co_await wait_all(Stage::posted, "every rank's shared-memory record");
  arena_.set_crowded(world > usable_cpus());
  const SingleCopy policy = arena_.policy();
  bool reads_all = policy != SingleCopy::never;
  for (int r = 0; r < world && reads_all; ++r) {
    std::uint64_t word = 0;
    const RankRecord& peer = arena_.record(r);
    reads_all = read_process_memory(peer.pid, peer.probe, &word, sizeof word) == 0 &&
                word == SharedMemoryArena::kProbeValue;
  }
  mine.reads_peers = reads_all ? 1 : 0;
  mine.all_reduce_direct = policy == SingleCopy::whenever_allowed ||
                                   (policy == SingleCopy::unless_crowded && world <= usable_cpus())
                               ? 1
                               : 0;
  raise(Stage::released);
  co_await wait_all(Stage::released, "every rank's cross-memory probe");
  bool all_can = true;
  bool all_reduce_too = true;
  for (int r = 0; r < world; ++r) {
    all_can = all_can && arena_.record(r).reads_peers == 1;
    all_reduce_too = all_reduce_too && arena_.record(r).all_reduce_direct == 1;
  }
  arena_.set_single_copy(all_can, all_reduce_too);
}

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
  mine.call = call;
  // A peer whose count put it on the inline path (shared_memory_inline.cpp) compares
  // fingerprints in the inline slots of this generation: ours must be there too.
  arena_.inline_slot(op_.rank(), static_cast<int>(generation_ & 1)).call = call;
  all_posted_ = false;
  raise(Stage::posted);
  co_await wait_all(Stage::posted, "every rank's shared-memory record");
  all_posted_ = true;
  co_await agree_on_call(false);
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
}

asio::awaitable<void> ArenaTurn::agree_on_call(bool inline_slots) {
  const int parity = static_cast<int>(generation_ & 1);
  auto call_of = [&](int r) -> const Fingerprint& {
    return inline_slots ? arena_.inline_slot(r, parity).call : arena_.record(r).call;
  };
  const Fingerprint& first = call_of(0);
  for (int r = 1; r < op_.size(); ++r) {
    const Fingerprint& other = call_of(r);
    if (other == first) continue;
    // Every rank reaches this verdict from the same fingerprints. Word it before releasing
    // them: a rank that fails first may post its next record once everyone has released.
    Error mismatch(
        Errc::size_mismatch,
        fmt::format("rank {} calls {} but rank {} calls {}: counts or dtypes differ "
                    "across ranks",
                    op_.world_rank(0), describe(first), op_.world_rank(r), describe(other)),
        {.rank = op_.world_rank(op_.rank()), .peer = op_.world_rank(op_.rank() == 0 ? r : 0)});
    co_await release();
    finish();  // every rank fails at the same point: the arena is still in step
    throw mismatch;
  }
}

asio::awaitable<void> ArenaTurn::release() {
  raise(Stage::released);
  co_await wait_all(Stage::released, "every rank to finish reading shared buffers");
}

void ArenaTurn::raise(Stage stage) noexcept {
  arena_.flag(op_.rank(), stage).store(generation_, std::memory_order_release);
}

asio::awaitable<void> ArenaTurn::wait_all(Stage stage, std::string_view what) {
  SharedMemoryArena* shared = &arena_;
  const std::uint64_t generation = generation_;
  const int world = op_.size();
  co_await op_.poll_until(
      [shared, world, stage, generation] {
        for (int r = 0; r < world; ++r) {
          if (shared->flag(r, stage).load(std::memory_order_acquire) < generation) return false;
        }
        return true;
      },
      what, spin_window());
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
      // Only we read or write these elements of any rank's buffers (each rank folds its
      // own block): a peer's in-place input here was read above, for the last time.
      for (int step = 1; step < world; ++step) {
        turn.write_output((me + step) % world, at, destination, n * element);
      }
    }
  }
}

}  // namespace braid::collectives::detail
