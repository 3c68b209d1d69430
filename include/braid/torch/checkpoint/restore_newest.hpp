// Where a restarted job resumes: the newest step every rank holds whole in memory
// (MemoryCheckpoints) or every rank holds whole on disk (DiskCheckpoints), from memory where
// both hold it. One source for all ranks: memory's copies of replicated tensors are shares
// that the ranks gather whole together.
//
// A collective on the communicator: every rank lists the steps it can read back from each
// (checksums verified), the lists are all-gathered, and all take the same step. The
// copies of later steps some ranks hold (they got further before the failure) are then
// dropped from memory and disk: the job's timeline forks at the step taken, and a later
// failure must not mix a copy from the abandoned branch with one from the new.
#pragma once

#include <optional>
#include <string>

#include <braid/collectives/communicator.hpp>
#include <braid/torch/checkpoint/disk_checkpoints.hpp>

namespace braid::torch {

class MemoryCheckpoints;

struct RestoredState {
  TrainingState state;
  std::string source;  // "memory", or the checkpoint directory
};

// Either source may be null. nullopt when no step is held by every rank (a fresh start).
std::optional<RestoredState> restore_newest(collectives::Communicator& comm,
                                            MemoryCheckpoints* memory, DiskCheckpoints* disk);

}  // namespace braid::torch
