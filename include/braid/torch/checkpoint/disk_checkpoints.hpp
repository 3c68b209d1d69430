// Restartable training: each rank's whole training state (its parameters or shards, its
// optimizer's state, the step, the data position, its random generators) written to disk
// every few steps in the background, and read back, by every rank alike, from the newest
// step every rank has whole. What every rank holds alike (TrainingState::replicated) is
// written once over the ranks, each rank's file holding its share.
//
//   braid::torch::DiskCheckpoints checkpoints(dir, comm);
//   if (auto state = checkpoints.restore()) resume_from(*state);   // collective
//   for (...) {
//     train_one_step();
//     if (step % every == 0) checkpoints.save_async(capture(step));  // returns at once
//   }
//   checkpoints.wait();
//
// Layout: <dir>/step-<step>/rank-<rank>-of-<world>.ckpt, one file per rank, so ranks on
// different machines can write to their own disks or to a shared one. A file is written
// under a temporary name, flushed to the disk (fsync) and renamed into place, so a crash
// mid-write leaves no file of that step rather than a torn one; its last 8 bytes are a
// checksum of the rest, so a file damaged later is refused by name when read. Each rank
// keeps its newest `keep` files and removes older ones of its own.
//
// What it costs the step: save_async copies every tensor of the state to host memory
// before it returns (a memcpy of the state's bytes; the step's next updates cannot reach
// the snapshot); encoding, checksum, writing and fsync run on a thread of its own. A save
// that arrives while the previous one is still being written waits for it, so at most one
// snapshot is held beside the training state.
//
// restore() is a collective on the communicator: every rank lists the steps it holds
// whole (newest first, checksums verified), the ranks exchange the lists, and all take the
// newest step every rank holds. A step some rank lacks or holds damaged is skipped, with
// a warning naming the file; files of steps after the one taken (another timeline's, left by
// ranks that got further) are removed. The checkpoint must come from a job of the same
// world size. restore_newest() (restore_newest.hpp) does the same across these files and
// MemoryCheckpoints' copies.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include <torch/torch.h>

#include <braid/collectives/communicator.hpp>

namespace braid::torch {

class BackgroundJob;

// One rank's training state at the end of a step.
struct TrainingState {
  std::int64_t step = 0;                      // steps completed: training resumes with step `step`
  std::map<std::string, at::Tensor> tensors;  // by name: parameters, shards, buffers
  std::map<std::string, std::string> blobs;   // by name: bytes (optimizer, generators, data)
  // The tensors every rank of the communicator holds alike (DDP's parameters and optimizer
  // state): each rank saves 1/world of each, to memory or disk, and a restore gathers them
  // whole again, so a checkpoint of DDP costs each rank 1/world of the model's state.
  std::set<std::string> replicated;
};

struct DiskCheckpointOptions {
  int keep = 2;  // files each rank keeps, newest first (at least 2: a step is complete
                 // only once every rank has written it)
};

class DiskCheckpoints {
 public:
  // `directory` is made if missing. Throws braid::Error(Errc::invalid_argument) for keep < 2.
  DiskCheckpoints(std::filesystem::path directory, std::shared_ptr<collectives::Communicator> comm,
                  DiskCheckpointOptions options = {});
  ~DiskCheckpoints();  // waits for the write in flight; its error is logged, not thrown
  DiskCheckpoints(const DiskCheckpoints&) = delete;
  DiskCheckpoints& operator=(const DiskCheckpoints&) = delete;

  // Snapshots `state` (tensors copied to host memory now) and writes it in the background.
  // Throws the previous write's error, if it failed.
  void save_async(const TrainingState& state);

  // Waits until the last save is on disk; throws its error, if it failed.
  void wait();

  // Collective. The newest step every rank holds whole, read back; nullopt when there is
  // none (a fresh start).
  std::optional<TrainingState> restore();

  // Every step this rank holds whole, newest first (8 at most), read back with checksums
  // verified; each file refused is named in a warning. Not collective (restore_newest()).
  std::map<std::int64_t, TrainingState, std::greater<>> readable();

  // Removes this rank's files of the steps after `step`: once the job has gone back to
  // `step`, they are another timeline's.
  void forget_after(std::int64_t step);

  // A job that changed size (braid-run --nnodes MIN:MAX): the newest step under the
  // directory written whole by a job of another number of ranks (a file from each of its
  // ranks), as {step, ranks}; nullopt if none. Not collective.
  std::optional<std::pair<std::int64_t, int>> newest_of_another_size();
  // That step put together from every file its `ranks` wrote (checksums verified): the
  // replicated tensors whole (DDP's), and the rest from old rank `own_from`'s file -- where
  // the program knows which old rank held what this one needs -- or, with `own_from` < 0,
  // none: then a rank's own tensor (a shard) is an error naming it. Throws braid::Error
  // naming a file that cannot be read.
  TrainingState read_whole(std::int64_t step, int ranks, int own_from = -1);

  // This rank's file for `step` (for messages and tests).
  std::filesystem::path file_of(std::int64_t step) const;
  const std::filesystem::path& directory() const { return directory_; }

 private:
  std::filesystem::path directory_;
  std::shared_ptr<collectives::Communicator> comm_;
  DiskCheckpointOptions options_;
  std::unique_ptr<BackgroundJob> writer_;
};

// What a torch optimizer holds, into `state` under names beginning with `prefix`, and back
// into an optimizer built over the same parameters. Adam's, AdamW's and SGD's state per
// parameter goes in as the tensors themselves (the snapshot copies them once, as it does
// the parameters) and each group's learning rate as exact text; any other optimizer as its
// torch archive's bytes, which cost a serialisation on the training thread. Loading a
// state saved from another optimizer or parameter layout throws std::invalid_argument.
void save_optimizer(::torch::optim::Optimizer& optimizer, TrainingState& state,
                    const std::string& prefix);
void load_optimizer(::torch::optim::Optimizer& optimizer, const TrainingState& state,
                    const std::string& prefix);

// The default CPU generator's state as bytes, and back.
std::string cpu_generator_bytes();
void load_cpu_generator_bytes(const std::string& bytes);

}  // namespace braid::torch
