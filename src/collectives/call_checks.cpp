// One set of checks for every collective call of both communicators (call_checks.hpp). The
// checks of a call run in a fixed order, the root first, so that every communicator names
// the same first fault of a call in the same words.
#include "collectives/call_checks.hpp"

#include <limits>
#include <numeric>
#include <utility>

#include <fmt/format.h>

#include <braid/core/error.hpp>

namespace braid::collectives::detail {

namespace {

constexpr std::size_t kWrapped = std::numeric_limits<std::size_t>::max();

// The checks of one call, with the error naming the site.
class Checker {
 public:
  // Without a memory rule, only checks that place no buffer.
  Checker(const CallSite& site, std::string_view operation, const MemoryRule* memory = nullptr)
      : site_(site), operation_(operation), memory_(memory) {}

  template <class... Args>
  void that(bool condition, fmt::format_string<Args...> format, Args&&... args) const {
    if (!condition) fail(fmt::format(format, std::forward<Args>(args)...));
  }
  void placed(const Buffer& buffer, std::string_view name) const {
    std::string refused = (*memory_)(buffer, name);
    if (!refused.empty()) fail(std::move(refused));
  }
  // Both where the communicator takes buffers; the same dtype, and the same kind of memory
  // on the same device.
  void pair(const Buffer& input, const Buffer& output) const {
    placed(input, "input");
    placed(output, "output");
    that(input.dtype() == output.dtype(), "input is {} and output is {}", to_string(input.dtype()),
         to_string(output.dtype()));
    that(input.memory() == output.memory() && input.device() == output.device(),
         "input is {} memory (device {}) and output is {} memory (device {}); both must be "
         "in the same place",
         to_string(input.memory()), input.device(), to_string(output.memory()), output.device());
  }
  void rank(int r, std::string_view name) const {
    that(r >= 0 && r < site_.size, "{} {} is outside a communicator of {} ranks", name, r,
         site_.size);
  }
  // `block` times the communicator's size, or SIZE_MAX where that wraps around.
  std::size_t blocks_of(std::size_t block) const {
    std::size_t whole = 0;
    if (__builtin_mul_overflow(block, static_cast<std::size_t>(site_.size), &whole))
      return kWrapped;
    return whole;
  }
  // `whole` holds size() blocks of `block`; `block` is the rank's own or shares no memory.
  void blocks(const Buffer& whole, std::string_view whole_name, const Buffer& block,
              std::string_view block_name) const {
    that(whole.count() == blocks_of(block.count()),
         "{} has {} elements; it must hold {} blocks of the {}'s {}", whole_name, whole.count(),
         site_.size, block_name, block.count());
    block_or_disjoint(block, whole, static_cast<std::size_t>(site_.rank) * block.count());
  }
  void same_count(const Buffer& input, const Buffer& output) const {
    that(input.count() == output.count(), "input has {} elements and output {}", input.count(),
         output.count());
  }
  // `block` is `whole`'s elements from `offset` on (in place, as NCCL defines it), or shares
  // no memory with it: another rank's block would be overwritten before it is sent.
  void block_or_disjoint(const Buffer& block, const Buffer& whole, std::size_t offset) const {
    const bool in_place =
        block.count() == 0 || block.data() == whole.slice(offset, block.count()).data();
    that(in_place || disjoint(block, whole),
         "input and output overlap without being the same memory (in place means this rank's "
         "block of the whole buffer)");
  }
  // The same memory (in place) or none in common.
  void same_or_disjoint(const Buffer& a, const Buffer& b) const {
    that(disjoint(a, b) || a.data() == b.data(),
         "input and output overlap without being the same memory (in place means the same "
         "buffer)");
  }
  static bool disjoint(const Buffer& a, const Buffer& b) {
    const auto* a_begin = static_cast<const std::byte*>(a.data());
    const auto* b_begin = static_cast<const std::byte*>(b.data());
    return a.size_bytes() == 0 || b.size_bytes() == 0 || a_begin + a.size_bytes() <= b_begin ||
           b_begin + b.size_bytes() <= a_begin;
  }

  [[noreturn]] void fail(std::string what) const {
    throw Error(Errc::invalid_argument, std::move(what),
                {.rank = site_.world_rank,
                 .operation = site_.communicator.empty()
                                  ? std::string(operation_)
                                  : fmt::format("{} {}", site_.communicator, operation_)});
  }

  bool at_root(int root) const { return site_.rank == root; }
  std::size_t ranks() const { return static_cast<std::size_t>(site_.size); }
  std::size_t own(std::span<const std::size_t> counts) const {
    return counts[static_cast<std::size_t>(site_.rank)];
  }

 private:
  const CallSite& site_;
  std::string_view operation_;
  const MemoryRule* memory_;
};

void check_all_gather_v(const CollectiveCall& c, const Checker& check, int rank) {
  check.pair(c.input, c.output);
  check.that(c.counts.size() == check.ranks(), "{} counts for a communicator of {} ranks",
             c.counts.size(), check.ranks());
  check.that(c.input.count() == check.own(c.counts), "input has {} elements but counts[{}] is {}",
             c.input.count(), rank, check.own(c.counts));
  const std::size_t total = sum_of_counts(c.counts);
  check.that(c.output.count() == total, "output has {} elements; the counts add up to {}",
             c.output.count(), total);
  // No prefix of counts wraps around once their sum does not.
  const std::size_t offset =
      std::accumulate(c.counts.begin(), c.counts.begin() + rank, std::size_t{0});
  check.block_or_disjoint(c.input, c.output, offset);
}

void check_all_to_all_v(const CollectiveCall& c, const Checker& check) {
  check.pair(c.input, c.output);
  check.that(c.counts.size() == check.ranks() && c.recv_counts.size() == check.ranks(),
             "{} send counts and {} receive counts for a communicator of {} ranks", c.counts.size(),
             c.recv_counts.size(), check.ranks());
  const std::size_t sent = sum_of_counts(c.counts);
  const std::size_t received = sum_of_counts(c.recv_counts);
  check.that(c.input.count() == sent, "input has {} elements; the send counts add up to {}",
             c.input.count(), sent);
  check.that(c.output.count() == received,
             "output has {} elements; the receive counts add up to {}", c.output.count(), received);
  check.that(c.input.data() != c.output.data() || c.input.count() == 0 || c.output.count() == 0,
             "all_to_all_v cannot run in place");
  check.same_or_disjoint(c.input, c.output);
}

}  // namespace

MemoryRule host_or_staged_memory(bool stages_cuda) {
  return [stages_cuda](const Buffer& buffer, std::string_view name) -> std::string {
    if (buffer.memory() == MemoryKind::host || stages_cuda) return {};
    return fmt::format("the {} is {} memory (device {}), and this build of braid has no CUDA", name,
                       to_string(buffer.memory()), buffer.device());
  };
}

MemoryRule device_memory(int device) {
  return [device](const Buffer& buffer, std::string_view name) -> std::string {
    if (buffer.empty() || (buffer.memory() == MemoryKind::cuda && buffer.device() == device)) {
      return {};
    }
    return fmt::format(
        "the {} is {} memory (device {}); this NCCL communicator moves CUDA memory of device {}",
        name, to_string(buffer.memory()), buffer.device(), device);
  };
}

std::size_t sum_of_counts(std::span<const std::size_t> counts) {
  std::size_t sum = 0;
  for (const std::size_t count : counts) {
    if (__builtin_add_overflow(sum, count, &sum)) return kWrapped;
  }
  return sum;
}

std::string_view operation_name(const CollectiveCall& call) noexcept {
  if (call.variable && call.kind == CollectiveKind::all_gather) return "all_gather_v";
  if (call.variable && call.kind == CollectiveKind::all_to_all) return "all_to_all_v";
  return to_string(call.kind);
}

void check_call(const CollectiveCall& c, const CallSite& site, const MemoryRule& memory) {
  const Checker check(site, operation_name(c), &memory);
  if (is_rooted(c.kind)) check.rank(c.root, "root");
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      check.pair(c.input, c.output);
      check.same_count(c.input, c.output);
      check.same_or_disjoint(c.input, c.output);
      return;
    case CollectiveKind::reduce_scatter:
      check.pair(c.input, c.output);
      check.blocks(c.input, "input", c.output, "output");
      return;
    case CollectiveKind::reduce:
      check.placed(c.input, "input");
      if (!check.at_root(c.root)) return;
      check.pair(c.input, c.output);
      check.same_count(c.input, c.output);
      check.same_or_disjoint(c.input, c.output);
      return;
    case CollectiveKind::all_gather:
      if (c.variable) return check_all_gather_v(c, check, site.rank);
      check.pair(c.input, c.output);
      check.blocks(c.output, "output", c.input, "input");
      return;
    case CollectiveKind::broadcast:
      check.placed(c.output, "buffer");
      return;
    case CollectiveKind::gather:
      check.placed(c.input, "input");
      if (!check.at_root(c.root)) return;
      check.pair(c.input, c.output);
      check.blocks(c.output, "output", c.input, "input");
      return;
    case CollectiveKind::scatter:
      check.placed(c.output, "output");
      if (!check.at_root(c.root)) return;
      check.pair(c.input, c.output);
      check.blocks(c.input, "input", c.output, "output");
      return;
    case CollectiveKind::all_to_all:
      if (c.variable) return check_all_to_all_v(c, check);
      check.pair(c.input, c.output);
      check.same_count(c.input, c.output);
      check.that(c.input.count() % check.ranks() == 0,
                 "the buffers' {} elements must split into {} equal blocks", c.input.count(),
                 check.ranks());
      check.same_or_disjoint(c.input, c.output);
      return;
    case CollectiveKind::barrier:
      return;
  }
}

void check_point_to_point(std::string_view operation, const Buffer& data, int peer,
                          const CallSite& site, const MemoryRule& memory) {
  const Checker check(site, operation, &memory);
  check.rank(peer, "peer");
  check.placed(data, "buffer");
}

Buffer rank_block(CollectiveKind kind, const Buffer& whole, const CallSite& site) {
  const Checker check(site, to_string(kind));
  const auto ranks = static_cast<std::size_t>(site.size);
  check.that(whole.count() % ranks == 0,
             "in place, the buffer's {} elements must split into {} equal blocks", whole.count(),
             site.size);
  const std::size_t block = whole.count() / ranks;
  return whole.slice(static_cast<std::size_t>(site.rank) * block, block);
}

}  // namespace braid::collectives::detail
