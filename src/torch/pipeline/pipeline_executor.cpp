#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <braid/core/config.hpp>
#include <braid/core/deadline.hpp>
#include <braid/core/error.hpp>
#include <braid/core/fault_points.hpp>
#include <braid/core/future.hpp>
#include <braid/core/log.hpp>
#include <braid/torch/pipeline/pipeline_executor.hpp>
#include <braid/torch/tensor_buffer.hpp>
#include <braid/trace/compute_span.hpp>
#include <braid/trace/span.hpp>
#include <braid/transport/store/store.hpp>

namespace braid::torch {
namespace {

using parallel::Action;
using parallel::ActionKind;
using ::torch::Tensor;

// Transfer tags: above every tag a program would pick by hand, then direction, the stage
// that receives, and the microbatch. World tags below 2^32 are distinct.
constexpr std::uint64_t kTagBase = std::uint64_t{1} << 31;
std::uint64_t transfer_tag(bool gradient, int receiving_stage, int microbatch) {
  return kTagBase | (gradient ? std::uint64_t{1} << 30 : 0) |
         (static_cast<std::uint64_t>(receiving_stage) << 16) |
         static_cast<std::uint64_t>(microbatch);
}

// Each kind's text as a trace name, interned once (records keep names by pointer).
template <std::size_t... Kind>
std::array<trace::Name, sizeof...(Kind)> interned_kinds(std::index_sequence<Kind...>) {
  return {trace::intern(parallel::to_string(static_cast<ActionKind>(Kind)))...};
}
trace::Name span_name(ActionKind kind) {
  constexpr std::size_t kKinds = static_cast<std::size_t>(ActionKind::reduce_grad) + 1;
  static const auto names = interned_kinds(std::make_index_sequence<kKinds>());
  return names.at(static_cast<std::size_t>(kind));
}

using Key = std::pair<int, int>;  // (stage, microbatch)

// A transfer as a comm span from its start until it completes, on the "pipeline
// transfers" track: what braid-trace's overlap counts as hidden where compute ran beside it.
asio::awaitable<void> traced_send(transport::World& world, int peer, Buffer data, std::uint64_t tag,
                                  trace::AsyncSpan span) {
  co_await world.send(peer, data, tag);
  span.end();
}
// No deadline of its own: the compute that needs it waits with the executor's timeout,
// which names the action; a dead peer fails it through the World's failure detection.
asio::awaitable<std::size_t> traced_receive(transport::World& world, int peer, Buffer data,
                                            std::uint64_t tag, trace::AsyncSpan span) {
  const std::size_t received = co_await world.recv(peer, data, tag, Deadline::max());
  span.end();
  co_return received;
}

// Adds the time from its construction to its destruction to `total`: a compute action's.
class ComputeClock {
 public:
  explicit ComputeClock(std::chrono::steady_clock::duration& total)
      : total_(total), started_(std::chrono::steady_clock::now()) {}
  ~ComputeClock() { total_ += std::chrono::steady_clock::now() - started_; }
  ComputeClock(const ComputeClock&) = delete;
  ComputeClock& operator=(const ComputeClock&) = delete;

 private:
  std::chrono::steady_clock::duration& total_;
  std::chrono::steady_clock::time_point started_;
};

// What a rank says about its schedule: its description, and a hash of every list.
std::string describe(const parallel::Schedule& schedule) {
  std::uint64_t hash = 14695981039346656037ULL;  // FNV-1a over the CSV form
  for (const char c : parallel::to_csv(schedule)) {
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  }
  return fmt::format("{} over {} ranks, {} stages, {} microbatches (lists {:016x})", schedule.name,
                     schedule.ranks, schedule.stages, schedule.microbatches, hash);
}

// Every rank of the pipeline runs the same schedule, or every rank fails now, naming the
// first that differs from rank 0 and both schedules. One all-gather of 256 bytes a rank.
void check_same_schedule(collectives::Communicator& pipeline, const parallel::Schedule& schedule) {
  constexpr std::size_t kRecord = 256;
  const std::string mine = describe(schedule).substr(0, kRecord - 1);
  std::vector<std::uint8_t> record(kRecord, 0);
  std::copy(mine.begin(), mine.end(), record.begin());
  std::vector<std::uint8_t> all(kRecord * static_cast<std::size_t>(pipeline.size()));
  pipeline.launch(pipeline.all_gather(Buffer(record), Buffer(all))).get();
  const auto said = [&](int r) {
    return std::string(
        reinterpret_cast<const char*>(all.data() + kRecord * static_cast<std::size_t>(r)));
  };
  for (int r = 1; r < pipeline.size(); ++r) {
    if (said(r) != said(0)) {
      throw Error(Errc::invalid_argument,
                  fmt::format("the pipeline's ranks run different schedules: rank {} (world rank "
                              "{}) has {}, rank 0 (world rank {}) has {}",
                              r, pipeline.world_rank(r), said(r), pipeline.world_rank(0), said(0)),
                  {.rank = pipeline.world_rank(pipeline.rank()), .operation = "PipelineExecutor"});
    }
  }
}

}  // namespace

struct PipelineExecutor::State {
  std::map<int, PipelineStage> stages;
  std::map<int, std::size_t> last_backward;  // stage -> position of its last B or W
  // Per (stage, microbatch), from its F until its backward is done.
  std::map<Key, Tensor> inputs, outputs, output_grads;
  std::map<Key, Tensor> input_grads;  // for SEND_B, or the previous stage on this rank
  // Where this rank's list has a SEND_B; those a step's reducing backward sent from inside
  // the backward, before the reduction's wait (their SEND_B then has nothing to do).
  std::set<Key> sends_backward, sent_early;
  struct Receive {
    Tensor tensor;
    Future<std::size_t> done;
    int peer = -1;  // world rank
  };
  std::map<std::tuple<bool, int, int>, Receive> receives;  // (gradient, stage, microbatch)
  struct Send {
    Tensor tensor;
    Future<void> done;
  };
  std::vector<Send> sends;
  trace::Track track = trace::track("pipeline");
  trace::Track transfers = trace::track("pipeline transfers");
};

PipelineExecutor::PipelineExecutor(std::shared_ptr<collectives::Communicator> pipeline,
                                   parallel::Schedule schedule, std::vector<PipelineStage> stages,
                                   PipelineOptions options)
    : pipeline_(std::move(pipeline)),
      world_(pipeline_->world()),
      schedule_(std::move(schedule)),
      options_(std::move(options)),
      state_(std::make_unique<State>()) {
  const auto refuse = [&](std::string what) {
    throw Error(Errc::invalid_argument, std::move(what),
                {.rank = world_.rank(), .operation = "PipelineExecutor"});
  };
  for (int r = 0; r < pipeline_->size(); ++r) pipeline_ranks_.push_back(pipeline_->world_rank(r));
  check_same_schedule(*pipeline_, schedule_);
  parallel::validate(schedule_);
  if (!schedule_.lowered() && schedule_.ranks > 1) {
    refuse("the schedule has no transfers: lower() it first");
  }
  if (schedule_.stages >= (1 << 14) || schedule_.microbatches >= (1 << 16)) {
    refuse(
        fmt::format("{} stages and {} microbatches: the transfers' tags hold fewer than "
                    "16384 stages and 65536 microbatches",
                    schedule_.stages, schedule_.microbatches));
  }
  if (pipeline_->size() != schedule_.ranks) {
    refuse(fmt::format("the schedule has {} ranks, the pipeline {}", schedule_.ranks,
                       pipeline_->size()));
  }
  pipeline_rank_ = pipeline_->rank();
  for (PipelineStage& stage : stages) {
    if (stage.stage < 0 || stage.stage >= schedule_.stages ||
        schedule_.stage_rank[static_cast<std::size_t>(stage.stage)] != pipeline_rank_) {
      refuse(fmt::format("stage {} is not one the schedule places on pipeline rank {}", stage.stage,
                         pipeline_rank_));
    }
    state_->stages[stage.stage] = std::move(stage);
  }
  for (const int stage : schedule_.stages_of(pipeline_rank_)) {
    if (state_->stages.count(stage) == 0) {
      refuse(
          fmt::format("the schedule places stage {} on pipeline rank {}, and no stage "
                      "function was given for it",
                      stage, pipeline_rank_));
    }
  }
  const auto& mine = schedule_.actions[static_cast<std::size_t>(pipeline_rank_)];
  for (std::size_t i = 0; i < mine.size(); ++i) {
    if (mine[i].kind == ActionKind::backward || mine[i].kind == ActionKind::backward_weight) {
      state_->last_backward[mine[i].stage] = i;
    }
    if (mine[i].kind == ActionKind::send_backward) {
      state_->sends_backward.insert({mine[i].stage, mine[i].microbatch});
    }
  }
  if (schedule_.stages > 1 && options_.activation_shape.empty()) {
    refuse("activation_shape is needed to receive between stages");
  }
}

PipelineExecutor::~PipelineExecutor() {
  // Transfers still in flight after a step failed read or write tensors this owns, and a
  // receive from a peer that never sends would never end: their tensors are kept until the
  // process exits instead (a failed step's activations, once).
  static auto* in_flight = new std::vector<Tensor>();
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  for (auto& send : state_->sends) {
    if (send.done.valid() && !send.done.ready()) in_flight->push_back(send.tensor);
  }
  for (auto& [key, receive] : state_->receives) {
    if (receive.done.valid() && !receive.done.ready()) in_flight->push_back(receive.tensor);
  }
}

// One run() of the executor: the step's clocks and counters, and one method per kind of
// action in this rank's list.
class PipelineExecutor::Step {
 public:
  explicit Step(PipelineExecutor& executor)
      : executor_(executor),
        s_(*executor.state_),
        schedule_(executor.schedule_),
        mine_(schedule_.actions[static_cast<std::size_t>(executor.pipeline_rank_)]),
        timeout_(executor.options_.timeout.value_or(
            std::chrono::duration_cast<std::chrono::nanoseconds>(default_timeout()))),
        last_stage_(schedule_.stages - 1),
        runtime_(executor.world_.runtime()),
        started_(std::chrono::steady_clock::now()),
        posted_(mine_.size(), false) {}

  std::vector<double> run();

 private:
  void run_action(const Action& action);
  void send_forward(const Action& action);
  void send_backward(const Action& action);
  void forward(const Action& action);
  // B, I and W: the full backward, its input half, and its weight half.
  void backward(const Action& action);
  void reduce_grad(const Action& action);

  // Receives are posted one compute action ahead of where the list puts them: those the
  // next compute needs go out before the current one runs, so the transfer overlaps it.
  // Tags make the order of posting free; the cost is one more buffer in flight.
  void post_ahead(std::size_t from);
  void post_receive(const Action& action, bool gradient, int from_stage);
  // What a compute action consumes from a receive: waits for it, within the timeout.
  Tensor received(const Action& action, bool gradient);
  void start_send(const Action& action, const Tensor& tensor, bool gradient, int to_stage);
  // The gradient arriving at a stage's output: none for the loss, the next stage's input
  // gradient on this rank, or what RECV_B received.
  Tensor output_grad(const Action& action);
  // Waits for the step's sends, records its times, and checks nothing was left behind.
  void finish();

  int peer_of(int stage) const {
    return executor_.pipeline_ranks_[static_cast<std::size_t>(
        schedule_.stage_rank[static_cast<std::size_t>(stage)])];
  }
  bool local(int stage) const {
    return schedule_.stage_rank[static_cast<std::size_t>(stage)] == executor_.pipeline_rank_;
  }
  [[noreturn]] void fail(const Action& action, int peer, std::error_code code,
                         const std::string& why) const {
    throw Error(
        code,
        fmt::format("pipeline rank {} stage {} microbatch {}: {} {}", executor_.pipeline_rank_,
                    action.stage, action.microbatch, parallel::to_string(action), why),
        {.rank = executor_.world_.rank(), .peer = peer, .operation = "pipeline"});
  }

  PipelineExecutor& executor_;
  State& s_;
  const parallel::Schedule& schedule_;
  const std::vector<Action>& mine_;
  std::chrono::nanoseconds timeout_;
  int last_stage_;
  Runtime& runtime_;
  std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::duration computing_{};
  int gradients_sent_early_ = 0;
  std::size_t position_ = 0;  // of the action being run, in this rank's list
  std::vector<bool> posted_;
  std::vector<double> losses_;
};

std::vector<double> PipelineExecutor::run() {
  return Step(*this).run();
}

std::vector<double> PipelineExecutor::Step::run() {
  for (position_ = 0; position_ < mine_.size(); ++position_) {
    const Action& action = mine_[position_];
    if (parallel::is_compute(action.kind) || !posted_[position_]) post_ahead(position_);
    run_action(action);
  }
  finish();
  return std::move(losses_);
}

void PipelineExecutor::Step::run_action(const Action& action) {
  switch (action.kind) {
    case ActionKind::recv_forward:
    case ActionKind::recv_backward:
      return;  // posted by post_ahead, at the latest here
    case ActionKind::send_forward:
      return send_forward(action);
    case ActionKind::send_backward:
      return send_backward(action);
    case ActionKind::forward:
      return forward(action);
    case ActionKind::backward:
    case ActionKind::backward_input:
    case ActionKind::backward_weight:
      return backward(action);
    case ActionKind::reduce_grad:
      return reduce_grad(action);
  }
}

void PipelineExecutor::Step::send_forward(const Action& action) {
  trace::instant(trace::Category::pipeline, span_name(action.kind), s_.track);
  start_send(action, s_.outputs.at({action.stage, action.microbatch}), false, action.stage + 1);
}

void PipelineExecutor::Step::send_backward(const Action& action) {
  trace::instant(trace::Category::pipeline, span_name(action.kind), s_.track);
  const Key key{action.stage, action.microbatch};
  if (s_.sent_early.erase(key) != 0) {
    s_.input_grads.erase(key);
    return;
  }
  const auto found = s_.input_grads.find(key);
  if (found == s_.input_grads.end()) {
    fail(action, -1, Errc::invalid_argument, "sends a gradient no backward made");
  }
  start_send(action, found->second, true, action.stage - 1);
  s_.input_grads.erase(found);
}

void PipelineExecutor::Step::forward(const Action& action) {
  const Key key{action.stage, action.microbatch};
  Tensor input;
  if (action.stage > 0) {
    const Tensor arrived = local(action.stage - 1)
                               ? s_.outputs.at({action.stage - 1, action.microbatch})
                               : received(action, false);
    input = arrived.detach().requires_grad_(true);
  }
  trace::AsyncSpan span(trace::Category::pipeline, span_name(action.kind), s_.track);
  span.arg("stage", action.stage);
  span.arg("microbatch", action.microbatch);
  trace::ComputeSpan compute("pipeline.forward");
  const ComputeClock clock(computing_);
  Tensor output = s_.stages.at(action.stage).forward(input, action.microbatch);
  compute.end();
  if (action.stage == last_stage_) {
    const auto mb = static_cast<std::size_t>(action.microbatch);
    losses_.resize(std::max(losses_.size(), mb + 1));
    losses_[mb] = output.item<double>();
  }
  s_.inputs[key] = input;
  s_.outputs[key] = output;
}

void PipelineExecutor::Step::backward(const Action& action) {
  const Key key{action.stage, action.microbatch};
  const PipelineStage& stage = s_.stages.at(action.stage);
  Tensor grad;
  if (action.kind == ActionKind::backward_weight) {
    grad = s_.output_grads[key];
    s_.output_grads.erase(key);
  } else {
    grad = output_grad(action);
  }
  trace::AsyncSpan span(trace::Category::pipeline, span_name(action.kind), s_.track);
  span.arg("stage", action.stage);
  span.arg("microbatch", action.microbatch);
  trace::ComputeSpan compute("pipeline.backward");
  const ComputeClock clock(computing_);
  const Tensor output = s_.outputs.at(key);
  const Tensor input = s_.inputs.at(key);
  const std::vector<Tensor> grads =
      grad.defined() ? std::vector<Tensor>{grad} : std::vector<Tensor>{};
  if (action.kind == ActionKind::backward_input) {
    if (input.defined()) {
      s_.input_grads[key] = ::torch::autograd::grad({output}, {input}, grads, true)[0];
    }
    s_.output_grads[key] = grad;
    return;
  }
  const bool reducing = s_.last_backward.at(action.stage) == position_;
  if (stage.prepare_backward) stage.prepare_backward(reducing);
  // The reducing backward ends waiting for the stage's data-parallel reduction (DDP's
  // or FSDP's end of backward). Its input gradient is ready before that wait: sent from
  // a hook as autograd makes it, the previous stage starts its backward while this
  // rank waits, instead of after, and the stages' waits overlap instead of adding up
  // along the cool-down.
  // The hook refers to this step: it goes when this backward ends, however it ends,
  // should a stage keep its input alive past the step.
  struct HookRemoval {
    Tensor tensor;
    std::optional<unsigned> hook;
    ~HookRemoval() {
      if (hook) tensor.remove_hook(*hook);
    }
  } hook_removal;
  if (action.kind == ActionKind::backward && reducing && stage.prepare_backward &&
      input.defined() && s_.sends_backward.count(key) != 0) {
    hook_removal.tensor = input;
    hook_removal.hook =
        hook_removal.tensor.register_hook([this, key, stage_index = action.stage](const Tensor& g) {
          start_send(
              {.stage = stage_index, .kind = ActionKind::send_backward, .microbatch = key.second},
              g, true, stage_index - 1);
          s_.sent_early.insert(key);
          ++gradients_sent_early_;
          return Tensor();
        });
  }
  if (action.kind == ActionKind::backward) {
    ::torch::autograd::backward({output}, grads);
    if (input.defined()) s_.input_grads[key] = input.grad();
  } else {
    ::torch::autograd::backward({output}, grads, false, false, stage.parameters);
  }
  s_.inputs.erase(key);
  s_.outputs.erase(key);
}

void PipelineExecutor::Step::reduce_grad(const Action& action) {
  // The stage's reduction ran in its last backward (see the header): the mark in the
  // trace of where it was done.
  trace::AsyncSpan span(trace::Category::pipeline, span_name(action.kind), s_.track);
  span.arg("stage", action.stage);
}

void PipelineExecutor::Step::post_ahead(std::size_t from) {
  int computes = 0;
  for (std::size_t j = from; j < mine_.size() && computes < 2; ++j) {
    const Action& ahead = mine_[j];
    if (parallel::is_compute(ahead.kind)) ++computes;
    if (posted_[j]) continue;
    if (ahead.kind == ActionKind::recv_forward || ahead.kind == ActionKind::recv_backward) {
      trace::instant(trace::Category::pipeline, span_name(ahead.kind), s_.track);
      const bool gradient = ahead.kind == ActionKind::recv_backward;
      post_receive(ahead, gradient, gradient ? ahead.stage + 1 : ahead.stage - 1);
      posted_[j] = true;
    }
  }
}

void PipelineExecutor::Step::post_receive(const Action& action, bool gradient, int from_stage) {
  const PipelineOptions& options = executor_.options_;
  Tensor tensor = ::torch::empty(options.activation_shape,
                                 ::torch::TensorOptions().dtype(options.activation_dtype));
  const int peer = peer_of(from_stage);
  Future<std::size_t> done = runtime_.spawn(
      traced_receive(executor_.world_, peer, as_buffer(tensor),
                     transfer_tag(gradient, action.stage, action.microbatch),
                     trace::AsyncSpan(trace::Category::comm, span_name(action.kind), s_.transfers,
                                      static_cast<std::uint64_t>(tensor.nbytes()))));
  s_.receives[{gradient, action.stage, action.microbatch}] = {tensor, std::move(done), peer};
}

Tensor PipelineExecutor::Step::received(const Action& action, bool gradient) {
  const auto found = s_.receives.find({gradient, action.stage, action.microbatch});
  if (found == s_.receives.end()) {
    fail(action, -1, Errc::invalid_argument,
         fmt::format("needs a {} that no {} before it receives", gradient ? "gradient" : "input",
                     gradient ? "RECV_B" : "RECV_F"));
  }
  State::Receive& receive = found->second;
  if (!receive.done.wait_for(timeout_)) {
    fail(action, receive.peer, Errc::timeout,
         fmt::format("waited {:.1f} s for the {} from world rank {}{}",
                     std::chrono::duration<double>(timeout_).count(),
                     gradient ? "gradient" : "activation", receive.peer,
                     config::string_value("BRAID_DEBUG") == "detail"
                         ? executor_.diagnose_hang(position_, action)
                         : std::string(" (BRAID_DEBUG=detail shows where every rank of the "
                                       "pipeline waits)")));
  }
  try {
    receive.done.get();
  } catch (const Error& e) {
    fail(action, receive.peer, e.code(),
         fmt::format("receiving from world rank {}: {}", receive.peer, e.what()));
  }
  Tensor tensor = receive.tensor;
  s_.receives.erase(found);
  return tensor;
}

void PipelineExecutor::Step::start_send(const Action& action, const Tensor& tensor, bool gradient,
                                        int to_stage) {
  const PipelineOptions& options = executor_.options_;
  Tensor payload = tensor.detach().contiguous();
  if (payload.sizes().vec() != options.activation_shape ||
      payload.scalar_type() != options.activation_dtype) {
    fail(action, -1, Errc::invalid_argument,
         fmt::format("sends a tensor of shape [{}] and type {}; the pipeline moves [{}] {}",
                     fmt::join(payload.sizes(), ", "), c10::toString(payload.scalar_type()),
                     fmt::join(options.activation_shape, ", "),
                     c10::toString(options.activation_dtype)));
  }
  Future<void> done = runtime_.spawn(
      traced_send(executor_.world_, peer_of(to_stage), as_buffer(payload),
                  transfer_tag(gradient, to_stage, action.microbatch),
                  trace::AsyncSpan(trace::Category::comm, span_name(action.kind), s_.transfers,
                                   static_cast<std::uint64_t>(payload.nbytes()))));
  s_.sends.push_back({payload, std::move(done)});
  fault_point(FaultPoint::pipeline_send);
}

Tensor PipelineExecutor::Step::output_grad(const Action& action) {
  if (action.stage == last_stage_) return Tensor();
  if (local(action.stage + 1)) {
    const auto found = s_.input_grads.find({action.stage + 1, action.microbatch});
    if (found == s_.input_grads.end()) {
      fail(action, -1, Errc::invalid_argument, "runs before the next stage's backward");
    }
    Tensor grad = found->second;
    s_.input_grads.erase(found);
    return grad;
  }
  return received(action, true);
}

void PipelineExecutor::Step::finish() {
  const int pipeline_rank = executor_.pipeline_rank_;
  const int world_rank = executor_.world_.rank();
  for (auto& send : s_.sends) {
    if (!send.done.wait_for(timeout_)) {
      throw Error(Errc::timeout,
                  fmt::format("pipeline rank {}: a send did not complete within {:.0f} s",
                              pipeline_rank, std::chrono::duration<double>(timeout_).count()),
                  {.rank = world_rank, .operation = "pipeline"});
    }
    send.done.get();
  }
  s_.sends.clear();
  ++executor_.steps_run_;
  executor_.last_step_ = {
      .wall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - started_)
                     .count(),
      .compute_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(computing_).count(),
      .gradients_sent_early = gradients_sent_early_};
  if (!s_.inputs.empty() || !s_.receives.empty() || !s_.input_grads.empty()) {
    throw Error(
        Errc::invalid_argument,
        fmt::format("pipeline rank {}: the step ended with {} forwards not backwarded, "
                    "{} receives and {} gradients not consumed",
                    pipeline_rank, s_.inputs.size(), s_.receives.size(), s_.input_grads.size()),
        {.rank = world_rank, .operation = "pipeline"});
  }
}

std::string PipelineExecutor::diagnose_hang(std::size_t position, const Action& action) {
  // Every rank that times out says where it waits, in the World's store, under a key of this
  // pipeline and step; the first to say so gives the others a moment to time out too, then
  // prints them all on the schedule's grid. Ranks that never say so were not waiting on a
  // transfer: computing, or stuck outside the pipeline.
  transport::StoreClient& store = world_.store();
  Runtime& runtime = world_.runtime();
  const std::string base =
      fmt::format("braid/pipeline/{}.{}/step{}/", pipeline_->id(), pipeline_->serial(), steps_run_);
  const std::string where = std::to_string(position);
  log::warn("pipeline rank {} waits at position {} of its list: {}", pipeline_rank_, position,
            parallel::to_string(action));
  try {
    runtime
        .spawn(store.set(base + std::to_string(pipeline_rank_),
                         transport::Bytes(where.begin(), where.end())))
        .get();
    if (runtime.spawn(store.add(base + "reporters", 1)).get() != 1) {
      return " (BRAID_DEBUG=detail: the first rank of the pipeline to time out prints where "
             "each waits)";
    }
    const Deadline others = deadline_after(std::chrono::milliseconds(1500));
    std::vector<std::pair<int, int>> marked;
    std::vector<int> not_waiting;
    for (int r = 0; r < schedule_.ranks; ++r) {
      try {
        // Past the shared wait, a key that is there still answers at once.
        const Deadline deadline = std::max(others, deadline_after(std::chrono::milliseconds(50)));
        const transport::Bytes said =
            runtime.spawn(store.get(base + std::to_string(r), deadline)).get();
        marked.emplace_back(r, std::stoi(std::string(said.begin(), said.end())));
      } catch (const Error&) {
        not_waiting.push_back(r);
      }
    }
    const std::string idle =
        not_waiting.empty() ? std::string()
                            : fmt::format(
                                  "; not waiting on a transfer (computing, or stuck outside the "
                                  "pipeline): pipeline rank {}",
                                  fmt::join(not_waiting, ", "));
    const std::string grid = parallel::grid_text(schedule_, marked);
    log::warn("where each rank of the pipeline waits{}:\n{}", idle, grid);
    return fmt::format(
        "\nwhere each rank of the pipeline waits, marked >like this< "
        "(BRAID_DEBUG=detail){}:\n{}",
        idle, grid);
  } catch (const Error& e) {
    return fmt::format(" (BRAID_DEBUG=detail could not gather where the others wait: {})",
                       e.what());
  }
}

}  // namespace braid::torch
