// Restartable training as the main jobs (ddp_train, train_3d) offer it: checkpoints to
// disk (--checkpoint-dir, --checkpoint-every) and in memory (--memory-every), resuming by
// themselves from the newest step every rank holds whole when braid-run --max-restarts
// starts them again, and (--step-log) a line per step for braid-bench recovery to time
// failures by.
//
//   example_models::Restartable restart(choice, comm, "ddp_train");
//   int first = restart.resume([&](const TrainingState& s) { training.restore(s); });
//   for (int step = first; ...) {
//     forward();
//     restart.before_exchange();   // the in-memory copy of the last step whole
//     backward_and_update();
//     restart.after_step(step + 1, [&] { return training.state(step + 1); });
//   }
//   restart.finish();
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <braid/collectives/agreement.hpp>
#include <braid/collectives/communicator.hpp>
#include <braid/torch/checkpoint/disk_checkpoints.hpp>
#include <braid/torch/checkpoint/memory_checkpoints.hpp>

namespace example_models {

struct RestartChoice {
  std::string checkpoint_dir;  // empty: no disk checkpoints
  int checkpoint_every = 10;
  int memory_every = 0;  // 0: no in-memory checkpoints
  std::string step_log;  // empty: none

  // The options' help text, indented as the examples' usage is.
  static const char* usage();
  // Takes `arg` (with its value) if it is one of these options.
  bool parse(const std::string& arg, const std::function<std::string()>& value);
  bool restartable() const { return !checkpoint_dir.empty() || memory_every > 0; }
  // The choices every rank must make alike.
  std::vector<braid::collectives::AgreedValue> agreed() const;
};

class Restartable {
 public:
  Restartable(const RestartChoice& choice, std::shared_ptr<braid::collectives::Communicator> comm,
              std::string program);
  ~Restartable();

  // Collective. 0 for a fresh start; else the step after the newest one every rank holds
  // whole (memory or disk), whose state `restore` has been given; rank 0 says which.
  // `own_state_from`: see braid::torch::restore_newest (a job that changed size).
  int resume(const std::function<void(const braid::torch::TrainingState&)>& restore,
             const std::function<int(int old_world)>& own_state_from = {});

  // Before this step sends what lets another rank finish its next update (DDP: before
  // backward; a pipeline: before the step): the last in-memory copy must be whole by then.
  void before_exchange();

  // After the update that completes step `done` (counting from 1): the copies it is due,
  // and its line in --step-log.
  void after_step(int done, const std::function<braid::torch::TrainingState()>& capture);

  // The copies in flight finished (the last save on disk before the job ends).
  void finish();

 private:
  RestartChoice choice_;
  std::shared_ptr<braid::collectives::Communicator> comm_;
  std::string program_;
  std::optional<braid::torch::DiskCheckpoints> disk_;
  std::optional<braid::torch::MemoryCheckpoints> memory_;
  int step_log_ = -1;
  std::int64_t restart_count_ = 0;
};

// A training state of the usual shape: `parameters` as "parameter.NNNN", copies of
// `buffers` as "buffer.NNNN" (a forward may change them while an in-memory copy reads the
// state), the optimizer's state and the CPU generator. restore_training_state() puts one
// back, naming what does not fit.
braid::torch::TrainingState training_state(std::int64_t step,
                                           const std::vector<torch::Tensor>& parameters,
                                           const std::vector<torch::Tensor>& buffers,
                                           torch::optim::Optimizer& optimizer);
void restore_training_state(const braid::torch::TrainingState& state,
                            const std::vector<torch::Tensor>& parameters,
                            const std::vector<torch::Tensor>& buffers,
                            torch::optim::Optimizer& optimizer);

}  // namespace example_models
