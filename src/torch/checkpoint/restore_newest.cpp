#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <braid/core/buffer.hpp>
#include <braid/core/log.hpp>
#include <braid/torch/checkpoint/memory_checkpoints.hpp>
#include <braid/torch/checkpoint/restore_newest.hpp>

namespace braid::torch {

std::optional<RestoredState> restore_newest(collectives::Communicator& comm,
                                            MemoryCheckpoints* memory, DiskCheckpoints* disk) {
  using Held = std::map<std::int64_t, TrainingState, std::greater<>>;
  Held in_memory = memory != nullptr ? memory->readable() : Held{};
  Held on_disk = disk != nullptr ? disk->readable() : Held{};
  // The steps this rank offers, newest first, padded with -1 to one length on every rank.
  constexpr std::size_t kOffered = 16;
  std::vector<std::int64_t> offered;
  for (const Held* held : {&in_memory, &on_disk}) {
    for (const auto& [step, state] : *held) offered.push_back(step);
  }
  std::sort(offered.rbegin(), offered.rend());
  offered.erase(std::unique(offered.begin(), offered.end()), offered.end());
  offered.resize(kOffered, -1);

  std::vector<std::int64_t> all(kOffered * static_cast<std::size_t>(comm.size()));
  comm.launch(comm.all_gather(Buffer(offered), Buffer(all))).get();
  auto offered_by = [&](int rank, std::int64_t step) {
    const auto begin = all.begin() + static_cast<std::ptrdiff_t>(kOffered) * rank;
    return std::find(begin, begin + static_cast<std::ptrdiff_t>(kOffered), step) !=
           begin + static_cast<std::ptrdiff_t>(kOffered);
  };
  std::optional<std::int64_t> chosen;
  for (std::int64_t step : offered) {
    if (step < 0) break;
    bool everywhere = true;
    for (int r = 0; r < comm.size() && everywhere; ++r) everywhere = offered_by(r, step);
    if (everywhere) {
      chosen = step;
      break;
    }
  }
  if (!chosen) {
    if (offered.front() >= 0) {
      // Left in place: a directory given by mistake must not be emptied.
      log::warn("rank {} holds checkpoints of steps {} that not every rank holds: starting afresh",
                comm.rank(),
                fmt::join(offered.begin(), std::find(offered.begin(), offered.end(), -1), ", "));
    }
    return std::nullopt;
  }
  if (memory != nullptr) memory->forget_after(*chosen);
  if (disk != nullptr) disk->forget_after(*chosen);
  if (auto found = in_memory.find(*chosen); found != in_memory.end()) {
    return RestoredState{.state = std::move(found->second), .source = "memory"};
  }
  return RestoredState{.state = std::move(on_disk.at(*chosen)),
                       .source = disk->directory().string()};
}

}  // namespace braid::torch
