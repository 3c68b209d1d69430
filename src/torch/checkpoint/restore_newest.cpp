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

// The lists every rank offers, gathered: per rank, kOffered steps of each source.
enum Source : std::size_t { kMemory = 0, kDisk = 1, kHeldForPartner = 2, kSources = 3 };

}  // namespace

std::optional<RestoredState> restore_newest(collectives::Communicator& comm,
                                            MemoryCheckpoints* memory, DiskCheckpoints* disk,
                                            const std::function<int(int)>& own_state_from) {
  Held in_memory = memory != nullptr ? memory->readable() : Held{};
  Held on_disk = disk != nullptr ? disk->readable() : Held{};
  const int partner = memory != nullptr ? memory->partner() : -1;
  std::vector<std::int64_t> held_for_partner =
      partner >= 0 ? memory->partner_steps() : std::vector<std::int64_t>{};
  held_for_partner.resize(kOffered, -1);
  // Every rank's steps in memory, on disk, and held for its partner's partner (the copies
  // of the rank it holds for). A step is taken from one source on every rank alike:
  // memory's copies of replicated tensors are shares, gathered by all together.
  std::vector<std::int64_t> offered = steps_of(in_memory);
  const std::vector<std::int64_t> disk_steps = steps_of(on_disk);
  offered.insert(offered.end(), disk_steps.begin(), disk_steps.end());
  offered.insert(offered.end(), held_for_partner.begin(), held_for_partner.end());
  std::vector<std::int64_t> all(offered.size() * static_cast<std::size_t>(comm.size()));
  comm.launch(comm.all_gather(Buffer(offered), Buffer(all))).get();
  const auto list = [&](int rank, Source source) {
    return all.begin() + static_cast<std::ptrdiff_t>(offered.size() * rank + kOffered * source);
  };
  const auto offers = [&](int rank, Source source, std::int64_t step) {
    return std::find(list(rank, source), list(rank, source) + kOffered, step) !=
           list(rank, source) + kOffered;
  };
  // In memory, rank r's step is its own copy or the one its partner holds for it.
  const auto in_memory_for = [&](int rank, std::int64_t step) {
    return offers(rank, kMemory, step) ||
           (partner >= 0 && offers(memory->partner_of(rank), kHeldForPartner, step));
  };
  // The newest step `source` holds for every rank; -1 if none. Every rank computes it
  // alike from the gathered lists.
  auto newest_everywhere = [&](Source source) {
    std::vector<std::int64_t> candidates;
    for (int r = 0; r < comm.size(); ++r) {
      for (Source s : {source, source == kMemory ? kHeldForPartner : source}) {
        candidates.insert(candidates.end(), list(r, s), list(r, s) + kOffered);
      }
    }
    std::sort(candidates.begin(), candidates.end(), std::greater<>());
    for (const std::int64_t step : candidates) {
      if (step < 0) break;
      bool everywhere = true;
      for (int r = 0; r < comm.size() && everywhere; ++r) {
        everywhere = source == kMemory ? in_memory_for(r, step) : offers(r, source, step);
      }
      if (everywhere) return step;
    }
    return std::int64_t{-1};
  };
  const std::int64_t from_memory = newest_everywhere(kMemory);
  const std::int64_t from_disk = newest_everywhere(kDisk);
  // A job whose size changed (braid-run --nnodes MIN:MAX) finds its newest step written by
  // another number of ranks: taken whole from their files, if every rank sees the same one
  // (a directory they share) and it is newer than any of this size.
  std::vector<std::int64_t> other_size{-1, 0};
  if (disk != nullptr) {
    if (const auto newest = disk->newest_of_another_size())
      other_size = {newest->first, newest->second};
  }
  std::vector<std::int64_t> every_other(other_size.size() * static_cast<std::size_t>(comm.size()));
  comm.launch(comm.all_gather(Buffer(other_size), Buffer(every_other))).get();
  bool agreed = true;
  for (std::size_t i = 0; i < every_other.size(); ++i)
    agreed = agreed && every_other[i] == other_size[i % 2];
  if (agreed && other_size[0] > std::max(from_memory, from_disk)) {
    const std::int64_t step = other_size[0];
    const int ranks = static_cast<int>(other_size[1]);
    if (memory != nullptr) memory->forget_after(step);
    disk->forget_after(step);
    if (comm.rank() == 0) {
      log::info("resuming at step {} on {} rank(s) from the checkpoint {} rank(s) wrote", step,
                comm.size(), ranks);
    }
    const int own_from = own_state_from ? own_state_from(ranks) : -1;
    return RestoredState{
        .state = disk->read_whole(step, ranks, own_from),
        .source = fmt::format("{} (written by {} rank(s))", disk->directory().string(), ranks)};
  }
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
  const bool memory_holds_it = from_memory == chosen;
  if (memory_holds_it && partner >= 0) {
    // Ranks whose own copy is gone (their node was replaced) get it from their partners.
    const bool mine_lost = !offers(comm.rank(), kMemory, chosen);
    const bool theirs_lost = !offers(memory->holds_for(), kMemory, chosen);
    if (std::optional<TrainingState> given = memory->trade(chosen, mine_lost, theirs_lost)) {
      in_memory[chosen] = std::move(*given);
    }
  }
  if (memory != nullptr) memory->forget_after(chosen);
  if (disk != nullptr) disk->forget_after(chosen);
  RestoredState restored{
      .state = std::move(memory_holds_it ? in_memory.at(chosen) : on_disk.at(chosen)),
      .source = memory_holds_it ? "memory" : disk->directory().string()};
  replicated_shares::gather(comm, restored.state);
  return restored;
}

}  // namespace braid::torch
