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

#include <functional>
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
//
// A job whose size changed (braid-run --nnodes MIN:MAX) takes up the newest step a job of
// another size wrote whole on disk, where it is newer than any of its own size: its
// replicated tensors joined from every file, and this rank's own tensors from the file of
// old rank `own_state_from(old world size)`, where the program gives that (train_3d: the
// rank of the old grid with this rank's tensor-parallel slice and stage); without it, only
// replicated state crosses sizes (DDP), and a rank's own tensor is refused by name.
std::optional<RestoredState> restore_newest(
    collectives::Communicator& comm, MemoryCheckpoints* memory, DiskCheckpoints* disk,
    const std::function<int(int old_world)>& own_state_from = {});

}  // namespace braid::torch
