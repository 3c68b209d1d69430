#include "braid_models/restartable.hpp"

#include <chrono>
#include <fcntl.h>
#include <iostream>
#include <stdexcept>
#include <unistd.h>

#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/log.hpp>
#include <braid/torch/checkpoint/restore_newest.hpp>

#include "braid_models/whole_number.hpp"

namespace example_models {

const char* RestartChoice::usage() {
  return R"(  --checkpoint-dir D       restartable: on start, resume after the newest step every rank
                           holds whole (in memory or under D: parameters, optimizer state,
                           generator; the data follows the step), and save every
                           --checkpoint-every steps under D in the background
                           (braid::torch::DiskCheckpoints)
  --checkpoint-every K     steps between checkpoints on disk (default 10)
  --memory-every K         restartable: copy the state every K steps into memory braid-run
                           keeps across restarts (braid::torch::MemoryCheckpoints; 0: none,
                           the default), so a restart loses at most one step
  --step-log F             rank 0 appends a JSON line per step to F: the step, which start
                           of the job it is (BRAID_RESTART_COUNT), CLOCK_MONOTONIC in ns
)";
}

bool RestartChoice::parse(const std::string& arg, const std::function<std::string()>& value) {
  if (arg == "--checkpoint-dir")
    checkpoint_dir = value();
  else if (arg == "--checkpoint-every")
    checkpoint_every = whole_number(arg, value(), 1);
  else if (arg == "--memory-every")
    memory_every = whole_number(arg, value(), 0);
  else if (arg == "--step-log")
    step_log = value();
  else
    return false;
  return true;
}

std::vector<braid::collectives::AgreedValue> RestartChoice::agreed() const {
  return {
      {"--checkpoint-every", checkpoint_dir.empty() ? "none" : std::to_string(checkpoint_every)},
      {"--memory-every", std::to_string(memory_every)}};
}

Restartable::Restartable(const RestartChoice& choice,
                         std::shared_ptr<braid::collectives::Communicator> comm,
                         std::string program)
    : choice_(choice), comm_(std::move(comm)), program_(std::move(program)) {
  if (!choice_.checkpoint_dir.empty()) disk_.emplace(choice_.checkpoint_dir, comm_);
  if (choice_.memory_every > 0) {
    memory_.emplace(comm_);
    if (!memory_->outlives_the_process() && comm_->rank() == 0) {
      std::cout << fmt::format(
          "{}: --memory-every keeps its copies in this process's memory, which a restart does "
          "not find: start it under braid-run for that\n",
          program_);
    }
  }
  if (!choice_.step_log.empty() && comm_->rank() == 0) {
    step_log_ = ::open(choice_.step_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (step_log_ < 0) throw std::runtime_error("cannot open --step-log " + choice_.step_log);
  }
  restart_count_ = braid::config::int_value("BRAID_RESTART_COUNT");
}

Restartable::~Restartable() {
  if (step_log_ >= 0) ::close(step_log_);
}

int Restartable::resume(const std::function<void(const braid::torch::TrainingState&)>& restore,
                        const std::function<int(int)>& own_state_from) {
  if (!choice_.restartable()) return 0;
  auto restored = braid::torch::restore_newest(*comm_, memory_ ? &*memory_ : nullptr,
                                               disk_ ? &*disk_ : nullptr, own_state_from);
  if (!restored) return 0;
  restore(restored->state);
  if (comm_->rank() == 0) {
    std::cout << fmt::format("{}: resuming after step {} from {}\n", program_, restored->state.step,
                             restored->source);
  }
  return static_cast<int>(restored->state.step);
}

void Restartable::before_exchange() {
  if (memory_) memory_->wait();
}

void Restartable::after_step(int done,
                             const std::function<braid::torch::TrainingState()>& capture) {
  const bool to_memory = memory_ && done % choice_.memory_every == 0;
  const bool to_disk = disk_ && done % choice_.checkpoint_every == 0;
  if (to_memory || to_disk) {
    const braid::torch::TrainingState state = capture();
    if (to_memory) memory_->save_async(state);
    if (to_disk) disk_->save_async(state);
  }
  if (step_log_ >= 0) {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count();
    const std::string line =
        fmt::format("{{\"step\": {}, \"start\": {}, \"ns\": {}}}\n", done, restart_count_, ns);
    if (::write(step_log_, line.data(), line.size()) < 0) {
      braid::log::warn("cannot write --step-log {}", choice_.step_log);
    }
  }
}

void Restartable::finish() {
  if (memory_) memory_->wait();
  if (disk_) disk_->wait();
}

braid::torch::TrainingState training_state(std::int64_t step,
                                           const std::vector<torch::Tensor>& parameters,
                                           const std::vector<torch::Tensor>& buffers,
                                           torch::optim::Optimizer& optimizer) {
  braid::torch::TrainingState state{.step = step};
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    state.tensors[fmt::format("parameter.{:04}", i)] = parameters[i];
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    state.tensors[fmt::format("buffer.{:04}", i)] = buffers[i].detach().clone();
  }
  braid::torch::save_optimizer(optimizer, state, "optimizer");
  state.blobs["cpu_generator"] = braid::torch::cpu_generator_bytes();
  return state;
}

void restore_training_state(const braid::torch::TrainingState& state,
                            const std::vector<torch::Tensor>& parameters,
                            const std::vector<torch::Tensor>& buffers,
                            torch::optim::Optimizer& optimizer) {
  torch::NoGradGuard no_grad;
  auto put_back = [&](const std::vector<torch::Tensor>& into, const char* kind) {
    for (std::size_t i = 0; i < into.size(); ++i) {
      const std::string name = fmt::format("{}.{:04}", kind, i);
      const auto found = state.tensors.find(name);
      if (found == state.tensors.end() || !found->second.sizes().equals(into[i].sizes())) {
        throw std::invalid_argument(fmt::format(
            "the checkpoint of step {} holds no {} of this model's shape", state.step, name));
      }
      into[i].copy_(found->second);
    }
  };
  put_back(parameters, "parameter");
  put_back(buffers, "buffer");
  braid::torch::load_optimizer(optimizer, state, "optimizer");
  braid::torch::load_cpu_generator_bytes(state.blobs.at("cpu_generator"));
}

}  // namespace example_models
