// Runs a pipeline schedule (braid/parallel/pipeline_schedule.hpp) on libtorch stages: each
// rank walks its own list of actions, the forwards and backwards calling the user's stage
// modules, the transfers moving activations and their gradients between the ranks of its
// pipeline, asynchronously, so they overlap compute.
//
//   auto schedule = braid::parallel::lower(braid::parallel::one_f_one_b(pp, microbatches),
//                                          {.reduce_grad = dp > 1});
//   auto pp = co_await grid->group(braid::parallel::Axis::pp);    // or launch(...).get()
//   braid::torch::PipelineExecutor pipeline(pp, schedule, std::move(stages),
//                                           {.activation_shape = {seq, batch, hidden}});
//   auto losses = pipeline.run();   // one training step's forwards and backwards
//   optimizer.step();
//
// Stages. The user gives this rank's stages (those the schedule places on it), each a
// function from its input to its output for one microbatch: the first stage's input is
// undefined (it reads the microbatch's data itself), the last stage's output is the
// microbatch's loss, a scalar, already scaled as the step wants it (divided by the
// microbatches, for a mean); other outputs are activations of `activation_shape` and
// `activation_dtype` on every stage (the shape is stated once, not exchanged per message).
//
// Actions. F runs the stage on its input (the previous stage's output on this rank, or
// what its RECV_F received) and keeps input and output for the backward. B runs backward
// from the output (the loss, or with the gradient from the next stage) and frees them. I
// and W, where the schedule splits B: I computes the input's gradient alone
// (torch::autograd::grad, keeping the graph), W the parameters' (torch::autograd::backward
// on the stage's parameters); libtorch walks the stage's graph twice for them, so I + W
// cost about B plus a backward through the stage's activations (PyTorch's pipelining
// splits the graph instead). RECV_F and RECV_B post their receives one compute action
// before the list reaches them (so a transfer overlaps the compute before its consumer),
// and the compute that needs them waits; SEND_F and SEND_B start their sends and go on (each
// tensor kept until its send completes); a step ends when every send has. Transfers are
// tagged by (direction, stage, microbatch), so a schedule's receives need not come in the
// order of its sends.
//
// Data parallelism. A stage given `prepare_backward` (DistributedDataParallel's, wrapping
// the stage's module) is told before each of its backwards whether it is the stage's last
// in the step: the others accumulate locally; the last reduces the sum, its buckets
// launching as backward produces them, and completes before that backward returns, while
// the other ranks' cool-down still runs. REDUCE_GRAD marks that point in the trace.
//
// Waiting. A compute that waits for a transfer past `timeout` (BRAID_TIMEOUT by default)
// fails with Errc::timeout naming this rank, the stage, the microbatch, the action and the
// rank it waits for; a dead peer fails it with Errc::peer_failed naming the peer, through
// the World's failure detection, well before. With BRAID_DEBUG=detail each rank that times
// out also logs where it waits and says so in the World's store, and the first of them
// waits 1.5 s for the others, then prints the schedule's grid with every waiting rank's
// action marked and names the ranks that were not waiting on a transfer (the one stuck
// computing, typically): where a hang is, in one picture.
//
// Tracing: every action is a span on the "pipeline" track (its text, "1F3", in the
// arguments stage and microbatch), F, B, I and W also compute spans, so `braid-trace
// summary` reports each rank's bubble and what its transfers hid.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include <braid/collectives/communicator.hpp>
#include <braid/parallel/pipeline_schedule.hpp>
#include <braid/transport/world.hpp>

namespace braid::torch {

struct PipelineStage {
  int stage = 0;  // the schedule's stage index
  // (input, microbatch) -> output: input undefined on the first stage; on the last, the
  // output is the microbatch's scalar loss.
  std::function<::torch::Tensor(const ::torch::Tensor& input, int microbatch)> forward;
  // The stage's parameters: what W differentiates.
  std::vector<::torch::Tensor> parameters;
  // DistributedDataParallel::prepare_for_backward of the stage's wrapper, or empty without
  // data parallelism.
  std::function<void(bool sync)> prepare_backward;
};

struct PipelineOptions {
  std::vector<std::int64_t> activation_shape;  // of one microbatch between stages
  ::torch::ScalarType activation_dtype = ::torch::kFloat;
  // How long a compute may wait for a transfer; nullopt: BRAID_TIMEOUT.
  std::optional<std::chrono::nanoseconds> timeout;
};

class PipelineExecutor {
 public:
  // `pipeline`: the communicator of this rank's pipeline (the grid's pp group), its rank r
  // running the schedule's rank r. `schedule`: lowered, and validated here. `stages`: this
  // rank's stages, every one the schedule places on it. A collective over `pipeline`: the
  // ranks compare their schedules (name, ranks, stages, microbatches and a hash of every
  // list), and where one differs every rank fails at once, naming it and both schedules,
  // instead of waiting for transfers that will never come. Throws Error(invalid_argument)
  // for that, a schedule that does not validate or whose ranks are not the pipeline's
  // size, or stages that are not this rank's.
  PipelineExecutor(std::shared_ptr<collectives::Communicator> pipeline, parallel::Schedule schedule,
                   std::vector<PipelineStage> stages, PipelineOptions options);
  ~PipelineExecutor();
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;

  // One step: every action of this rank's list, in order. Returns the losses of the
  // microbatches (as doubles, by microbatch) where this rank holds the last stage; empty
  // elsewhere. Gradients accumulate into the stages' parameters (zero them before).
  std::vector<double> run();

  // The last run()'s time on this rank, from its start until its last send completed, and
  // the part of it its compute actions (F, B, I, W) took: 1 - compute / wall is the
  // rank's bubble in that step, as the simulator counts it (take the pipeline's longest
  // wall for the step's). braid-trace's bubble spans every traced step, and so also counts
  // what runs between steps (the optimizer, data loading). `gradients_sent_early`: input
  // gradients a reducing backward sent from inside itself, before the data-parallel
  // reduction's wait (one per stage after the first that has a prepare_backward, where the
  // reducing action is a B; 0 under zero-bubble schedules, whose reducing action is a W).
  struct StepTimes {
    std::int64_t wall_ns = 0;
    std::int64_t compute_ns = 0;
    int gradients_sent_early = 0;
  };
  StepTimes last_step() const noexcept { return last_step_; }

  int pipeline_rank() const noexcept { return pipeline_rank_; }
  const parallel::Schedule& schedule() const noexcept { return schedule_; }

 private:
  struct State;
  class Step;  // one run(): a method per kind of action
  // BRAID_DEBUG=detail, after a receive timed out: where every rank of the pipeline waits.
  std::string diagnose_hang(std::size_t position, const parallel::Action& action);

  std::shared_ptr<collectives::Communicator> pipeline_;
  transport::World& world_;
  std::vector<int> pipeline_ranks_;
  int pipeline_rank_ = -1;
  parallel::Schedule schedule_;
  PipelineOptions options_;
  std::uint64_t steps_run_ = 0;
  StepTimes last_step_;
  std::unique_ptr<State> state_;
};

}  // namespace braid::torch
