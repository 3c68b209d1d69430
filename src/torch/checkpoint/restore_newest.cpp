#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <braid/core/buffer.hpp>
#include <braid/core/log.hpp>
#include <braid/torch/checkpoint/memory_checkpoints.hpp>
#include <braid/torch/checkpoint/restore_newest.hpp>

#include "replicated_shares.hpp"

namespace braid::torch {
namespace {

using Held = std::map<std::int64_t, TrainingState, std::greater<>>;

// Steps each source offers, at most this many, padded with -1: the same length on every rank.
constexpr std::size_t kOffered = 8;

std::vector<std::int64_t> steps_of(const Held& held) {
  std::vector<std::int64_t> steps;
  for (const auto& [step, state] : held) {
    if (steps.size() < kOffered) steps.push_back(step);
  }
  steps.resize(kOffered, -1);
  return steps;
}

}  // namespace

std::optional<RestoredState> restore_newest(collectives::Communicator& comm,
                                            MemoryCheckpoints* memory, DiskCheckpoints* disk) {
  Held in_memory = memory != nullptr ? memory->readable() : Held{};
  Held on_disk = disk != nullptr ? disk->readable() : Held{};
  // Every rank's steps in memory, then on disk. A step is taken from one source on every
  // rank alike: memory's copies of replicated tensors are shares, gathered by all together.
  std::vector<std::int64_t> offered = steps_of(in_memory);
  const std::vector<std::int64_t> disk_steps = steps_of(on_disk);
  offered.insert(offered.end(), disk_steps.begin(), disk_steps.end());
  std::vector<std::int64_t> all(offered.size() * static_cast<std::size_t>(comm.size()));
  comm.launch(comm.all_gather(Buffer(offered), Buffer(all))).get();
  // The newest step of source `source` (0 memory, 1 disk) on every rank's list; -1 if none.
  auto newest_everywhere = [&](std::size_t source) {
    const auto list = [&](int rank) {
      return all.begin() + static_cast<std::ptrdiff_t>(offered.size() * rank + kOffered * source);
    };
    for (auto at = list(comm.rank()); at != list(comm.rank()) + kOffered && *at >= 0; ++at) {
      bool everywhere = true;
      for (int r = 0; r < comm.size() && everywhere; ++r) {
        everywhere = std::find(list(r), list(r) + kOffered, *at) != list(r) + kOffered;
      }
      if (everywhere) return *at;
    }
    return std::int64_t{-1};
  };
  const std::int64_t from_memory = newest_everywhere(0);
  const std::int64_t from_disk = newest_everywhere(1);
  if (from_memory < 0 && from_disk < 0) {
    if (!in_memory.empty() || !on_disk.empty()) {
      // Left in place: a directory given by mistake must not be emptied.
      std::vector<std::int64_t> held;
      for (const Held* h : {&in_memory, &on_disk}) {
        for (const auto& [step, state] : *h) held.push_back(step);
      }
      log::warn("rank {} holds checkpoints of steps {} that not every rank holds: starting afresh",
                comm.rank(), fmt::join(held, ", "));
    }
    return std::nullopt;
  }
  const std::int64_t chosen = std::max(from_memory, from_disk);
  if (memory != nullptr) memory->forget_after(chosen);
  if (disk != nullptr) disk->forget_after(chosen);
  const bool memory_holds_it = from_memory == chosen;
  RestoredState restored{
      .state = std::move(memory_holds_it ? in_memory.at(chosen) : on_disk.at(chosen)),
      .source = memory_holds_it ? "memory" : disk->directory().string()};
  replicated_shares::gather(comm, restored.state);
  return restored;
}

}  // namespace braid::torch
