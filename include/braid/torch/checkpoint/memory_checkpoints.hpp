// In-memory checkpoints: each rank's training state copied into memory that outlives the
// rank's process, so that a job restarted after a failure resumes
// from the step before it, not from the last disk checkpoint.
//
//   braid::torch::MemoryCheckpoints memory(comm);
//   braid::torch::DiskCheckpoints disk(dir, comm);                 // optional beside it
//   if (auto r = braid::torch::restore_newest(*comm, &memory, &disk)) resume_from(r->state);
//   for (...) {
//     forward();
//     memory.wait();           // before this step's gradients leave the rank (host state:
//                              // the copy runs here)
//     backward_and_reduce();
//     optimizer_step();
//     memory.save_async(capture(step + 1));                       // returns at once
//   }
//
// Where the memory is: two slots, each a memfd (anonymous shared memory). Under braid-run
// the memfds are braid-run's, handed to each start of the rank (BRAID_SNAPSHOT_FDS), so
// they survive the rank's process and a restarted rank finds its copies there, as
// DLRover's agent keeps its workers' shared memory. Elsewhere (torchrun, srun) the rank
// makes memfds of its own, which end with it: restore_newest() then finds no copy in memory
// and falls back to disk; outlives_the_process() says which it is. The slots are
// memfds rather than files in /dev/shm, which containers often cap at 64 MiB.
//
// A slot holds the state as a checkpoint file's bytes (checkpoint_format), behind a header
// saying whose it is, which step, whether it is whole, and a sum of the bytes: a process
// killed while copying leaves its slot marked "being written", and the other slot holds the
// step before; a copy damaged since fails its sum. Both are refused by name.
//
// What it costs: a memcpy of this rank's bytes that sums them as it goes (about 15% over a
// bare memcpy). save_async() returns at once. A state on a device is copied on the
// checkpoints' own thread, beside the next step's compute; a state in host memory is copied
// by the wait() that needs it, on the caller's thread, because where the ranks already fill
// every core (CPU training) a thread of its own only adds a scheduler's delay. Either way
// the copy reads the state's tensors where they are, so they must not change until wait()
// returns: call wait() before the next update, and before anything that lets another rank
// finish its next update (under DDP, before backward: the gradients; under a pipeline,
// before the step begins). With that, when any rank dies, the newest step every rank holds
// whole is the newest any rank finished or the one before, and two slots always hold it:
// at most one step is lost.
//
// Replicated state is split: of each tensor TrainingState::replicated names (DDP's
// parameters and optimizer state, which every rank holds alike), each rank copies 1/world,
// so the copy and its memory shrink with the data-parallel degree (DiskCheckpoints writes
// alike). A restore gathers the shares whole again (an all-gather of the state); it needs
// every rank's copy.
//
// Partner copies, so that a node lost whole costs no more than a rank: in a job of several
// nodes under braid-run, each rank also sends its copy to its partner, the same local rank
// on the next node ((rank + local world size) % world, Gemini's ring), which keeps it in two
// more memfds its braid-run holds; any one node may then be lost. The exchange runs in
// wait(), after the rank's own copy is whole and before its gradients leave, so whenever a
// rank dies every copy of the step before the newest finished is whole on both sides. A
// replaced node's ranks receive their state from their partners at restore_newest(). What
// it costs: the state's bytes over the network every saved step, on the caller's thread
// (--memory-every K spreads it).
//
// Memory: twice the state's bytes per rank (12 bytes a parameter under FSDP with Adam, f32,
// of its shard; under DDP 12 / world), twice that with partner copies, in braid-run's
// memory, freed when braid-run ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <braid/collectives/communicator.hpp>
#include <braid/torch/checkpoint/disk_checkpoints.hpp>

namespace braid::torch {

struct MemoryCheckpointOptions {
  // The slots' memfds (the checkpoints keep duplicates of them): two for this rank's
  // copies, or four, the last two holding its partner's. Empty: the ones braid-run hands
  // the rank (BRAID_SNAPSHOT_FDS), else two of this process's own.
  std::vector<int> slot_fds;
  // How far the partner is: copies go to rank + distance and come from rank - distance
  // (modulo the world). -1: from braid-run's environment, the local world size where the
  // job spans several nodes (BRAID_NNODES, BRAID_LOCAL_WORLD_SIZE); 0: no partner. Needs
  // four slots.
  int partner_distance = -1;
};

class MemoryCheckpoints {
 public:
  // Throws braid::Error(Errc::invalid_environment) when BRAID_SNAPSHOT_FDS or slot_fds does
  // not name two or four open memfds (invalid_argument when slot_fds holds another count,
  // or a partner distance is given without four).
  explicit MemoryCheckpoints(std::shared_ptr<collectives::Communicator> comm,
                             MemoryCheckpointOptions options = {});
  ~MemoryCheckpoints();  // finishes the last copy (makes it, for a host state); its error
                         // is logged, not thrown
  MemoryCheckpoints(const MemoryCheckpoints&) = delete;
  MemoryCheckpoints& operator=(const MemoryCheckpoints&) = delete;

  // Copies `state` into the older slot: on the checkpoints' thread now for a device's
  // state, in the next wait() for a host's; returns at once either way. The tensors are
  // read until wait() returns. Finishes the copy before first, throwing its error.
  void save_async(const TrainingState& state);

  // Waits until the last copy is whole (the tensors are free to change) and, with a
  // partner, exchanged: sent to the partner, and the copy of the rank this one holds for
  // received. Throws the error of either, if one failed (a partner gone: peer_failed).
  void wait();

  // Collective: restore_newest() over these copies alone.
  std::optional<TrainingState> restore();

  // Every step this rank's slots hold whole, newest first, read back with checksums
  // verified; a slot refused (being written when its process died, damaged, another
  // rank's) is named in a warning. Replicated tensors come back as this rank's shares,
  // named in TrainingState::replicated. Not collective (restore_newest() gathers them).
  std::map<std::int64_t, TrainingState, std::greater<>> readable();

  // Marks this rank's copies of the steps after `step` empty (another timeline's), and
  // those it holds for another rank.
  void forget_after(std::int64_t step);

  // The rank this one sends its copies to, and the one whose copies it holds; -1 without a
  // partner.
  int partner() const { return partner_; }
  int holds_for() const { return holds_for_; }
  // The partner of any rank of the communicator; -1 without partners.
  int partner_of(int rank) const;
  // The steps this rank holds whole for holds_for(), sums verified, newest first.
  std::vector<std::int64_t> partner_steps();
  // Pairwise, at restore: sends the copy of `step` held for holds_for() to it where
  // `theirs_lost`, and where `mine_lost` receives this rank's own from partner() and
  // returns it (replicated tensors as this rank's shares).
  std::optional<TrainingState> trade(std::int64_t step, bool mine_lost, bool theirs_lost);

  // True when the slots are held outside this process (braid-run's, or slot_fds), so a
  // restarted rank finds them.
  bool outlives_the_process() const { return held_by_launcher_; }

  // Bytes the slots hold now.
  std::size_t bytes() const;

 private:
  class Slot;
  std::shared_ptr<collectives::Communicator> comm_;
  bool held_by_launcher_ = false;
  static Slot& to_overwrite(const std::vector<std::unique_ptr<Slot>>& pair);
  void exchange_with_partner(Slot& mine);
  Slot* partner_slot_holding(std::int64_t step);

  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<Slot>> partner_slots_;  // empty without a partner
  int distance_ = 0;  // partner_of(r) = (r + distance_) % size; 0: no partner
  int partner_ = -1;
  int holds_for_ = -1;
  Slot* unsent_ = nullptr;  // the own copy wait() sends to the partner next
  std::unique_ptr<BackgroundJob> copier_;
};

}  // namespace braid::torch
