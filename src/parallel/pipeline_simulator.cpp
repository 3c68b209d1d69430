// The pipeline simulator (pipeline_simulator.hpp): every action's begin and end from the
// ranks' lists and the costs, as a longest-path walk over the schedule's happens-before
// graph. Each pass advances every rank while its next action's inputs are known, so the
// walk is O(actions x passes); a valid schedule finishes in at most as many passes as
// the longest chain of cross-rank dependencies, a few times the stage count.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>
#include <braid/core/json_text.hpp>
#include <braid/parallel/pipeline_schedule.hpp>
#include <braid/parallel/pipeline_simulator.hpp>
#include <braid/trace/pipeline_bubble.hpp>

namespace braid::parallel {
namespace {

[[noreturn]] void invalid(std::string detail) {
  throw Error(Errc::invalid_argument, std::move(detail));
}

constexpr double kUnknown = -1;  // an end or arrival time not reached yet

// Per (stage, microbatch): when something about it finished, kUnknown until it has.
class StageTimes {
 public:
  StageTimes(int stages, int microbatches)
      : microbatches_(microbatches),
        times_(static_cast<std::size_t>(stages) * static_cast<std::size_t>(microbatches),
               kUnknown) {}
  double& at(int stage, int microbatch) {
    return times_[static_cast<std::size_t>(stage) * static_cast<std::size_t>(microbatches_) +
                  static_cast<std::size_t>(microbatch)];
  }

 private:
  int microbatches_;
  std::vector<double> times_;
};

// What the walk has learnt so far: compute ends and transfer arrivals.
struct Progress {
  Progress(int stages, int microbatches)
      : forward_end(stages, microbatches),
        input_grad_end(stages, microbatches),
        forward_arrival(stages, microbatches),
        backward_arrival(stages, microbatches) {}
  StageTimes forward_end;       // F
  StageTimes input_grad_end;    // B or I: the gradient of the stage's input
  StageTimes forward_arrival;   // SEND_F of stage s: its output at the next stage's rank
  StageTimes backward_arrival;  // SEND_B of stage s: its input gradient at the previous rank
};

double compute_cost(ActionKind kind, const SimulationCosts& costs) {
  switch (kind) {
    case ActionKind::forward:
      return costs.forward;
    case ActionKind::backward:
      return costs.backward;
    case ActionKind::backward_input:
      return costs.backward_input;
    case ActionKind::backward_weight:
      return costs.backward_weight;
    default:
      return 0;
  }
}

double transfer_cost(const SimulationCosts& costs) {
  return costs.p2p_latency +
         (costs.p2p_bytes_per_unit > 0 ? costs.p2p_bytes / costs.p2p_bytes_per_unit : 0);
}

void check_costs(const SimulationCosts& costs) {
  const std::pair<const char*, double> named[] = {{"forward", costs.forward},
                                                  {"backward", costs.backward},
                                                  {"backward_input", costs.backward_input},
                                                  {"backward_weight", costs.backward_weight},
                                                  {"p2p_latency", costs.p2p_latency},
                                                  {"p2p_bytes", costs.p2p_bytes},
                                                  {"p2p_bytes_per_unit", costs.p2p_bytes_per_unit},
                                                  {"reduce_grad", costs.reduce_grad}};
  for (const auto& [name, value] : named) {
    // Written so that NaN fails too.
    if (!(value >= 0 && value < std::numeric_limits<double>::infinity()))
      invalid(fmt::format("simulation cost {}={} is not a finite duration >= 0", name, value));
  }
}

// The walk over one schedule: `step(rank)` runs that rank's next action if its inputs are
// known and says whether it did.
class Walk {
 public:
  Walk(const Schedule& schedule, const SimulationCosts& costs)
      : schedule_(schedule),
        costs_(costs),
        lowered_(schedule.lowered()),
        progress_(schedule.stages, schedule.microbatches),
        next_(static_cast<std::size_t>(schedule.ranks), 0),
        free_(static_cast<std::size_t>(schedule.ranks), 0),
        busy_(static_cast<std::size_t>(schedule.ranks), 0),
        done_(static_cast<std::size_t>(schedule.ranks)) {}

  // A worklist: a rank runs until its next action waits, and is tried again only when an
  // action of a neighbouring stage completes (what it can wait for: the previous stage's
  // forward, the next stage's input gradient, a transfer from either). So the walk costs
  // O(actions), not a pass over every rank per wave of the pipeline.
  SimulationResult run() {
    std::size_t remaining = 0;
    for (const auto& list : schedule_.actions) remaining += list.size();
    queued_.assign(static_cast<std::size_t>(schedule_.ranks), 1);
    for (int rank = 0; rank < schedule_.ranks; ++rank) ready_ranks_.push_back(rank);
    while (!ready_ranks_.empty()) {
      const int rank = ready_ranks_.front();
      ready_ranks_.pop_front();
      queued_[static_cast<std::size_t>(rank)] = 0;
      while (step(rank)) --remaining;
    }
    // validate() refused every schedule whose happens-before graph has a cycle.
    BRAID_ENFORCE(remaining == 0, "a validated schedule deadlocks in the simulator: {}", stuck());
    return result();
  }

 private:
  bool step(int rank) {
    const auto r = static_cast<std::size_t>(rank);
    const auto& list = schedule_.actions[r];
    if (next_[r] == list.size()) return false;
    const Action& action = list[next_[r]];
    const std::optional<double> ready = ready_time(rank, action);
    if (!ready) return false;
    const double begin = std::max(free_[r], *ready);
    double end = begin;
    switch (action.kind) {
      case ActionKind::forward:
      case ActionKind::backward:
      case ActionKind::backward_input:
      case ActionKind::backward_weight:
        end = begin + compute_cost(action.kind, costs_);
        busy_[r] += end - begin;
        break;
      case ActionKind::recv_forward:
      case ActionKind::recv_backward:
        // The rank waits from when it is free until the tensor arrives.
        done_[r].push_back({rank, action, free_[r], begin});
        free_[r] = begin;
        ++next_[r];
        return true;
      case ActionKind::send_forward:
      case ActionKind::send_backward:
        break;  // the transfer runs in the background; the rank goes on
      case ActionKind::reduce_grad:
        end = begin + costs_.reduce_grad;
        break;
    }
    record(action, end);
    done_[r].push_back({rank, action, begin, end});
    free_[r] = end;
    ++next_[r];
    return true;
  }

  // When `action`'s inputs are all there (it may start then, or when the rank is free);
  // nullopt while one is not known yet.
  std::optional<double> ready_time(int rank, const Action& action) {
    const int s = action.stage;
    const int mb = action.microbatch;
    std::optional<double> ready = 0.0;
    // A producer's end: directly on the same rank; plus a transfer in a compute schedule
    // where it is on another rank (in a lowered one, the receive before this action waits
    // for the transfer).
    const auto needs = [&](StageTimes& ends, int stage) {
      const double end = ends.at(stage, mb);
      if (end == kUnknown) {
        ready.reset();
        return;
      }
      const bool remote = schedule_.stage_rank[static_cast<std::size_t>(stage)] != rank;
      if (ready) *ready = std::max(*ready, end + (remote && !lowered_ ? transfer_cost(costs_) : 0));
    };
    switch (action.kind) {
      case ActionKind::forward:
        if (s > 0) needs(progress_.forward_end, s - 1);
        break;
      case ActionKind::backward:
      case ActionKind::backward_input:
        needs(progress_.forward_end, s);
        if (ready && s + 1 < schedule_.stages) needs(progress_.input_grad_end, s + 1);
        break;
      case ActionKind::backward_weight:
        needs(progress_.input_grad_end, s);
        break;
      case ActionKind::recv_forward:
        return arrival(progress_.forward_arrival, s - 1, mb);
      case ActionKind::recv_backward:
        return arrival(progress_.backward_arrival, s + 1, mb);
      case ActionKind::send_forward:
      case ActionKind::send_backward:
      case ActionKind::reduce_grad:
        break;
    }
    return ready;
  }

  std::optional<double> arrival(StageTimes& arrivals, int sender_stage, int mb) {
    const double at = arrivals.at(sender_stage, mb);
    if (at == kUnknown) return std::nullopt;
    return at;
  }

  // The ranks of the stages next to `stage` may be waiting for what it just did.
  void wake_neighbours(int stage) {
    for (const int other : {stage - 1, stage + 1}) {
      if (other < 0 || other >= schedule_.stages) continue;
      const auto rank =
          static_cast<std::size_t>(schedule_.stage_rank[static_cast<std::size_t>(other)]);
      if (rank >= queued_.size() || queued_[rank] != 0) continue;
      queued_[rank] = 1;
      ready_ranks_.push_back(static_cast<int>(rank));
    }
  }

  void record(const Action& action, double end) {
    wake_neighbours(action.stage);
    const int s = action.stage;
    const int mb = action.microbatch;
    switch (action.kind) {
      case ActionKind::forward:
        progress_.forward_end.at(s, mb) = end;
        break;
      case ActionKind::backward:
      case ActionKind::backward_input:
        progress_.input_grad_end.at(s, mb) = end;
        break;
      case ActionKind::send_forward:
        progress_.forward_arrival.at(s, mb) = end + transfer_cost(costs_);
        break;
      case ActionKind::send_backward:
        progress_.backward_arrival.at(s, mb) = end + transfer_cost(costs_);
        break;
      default:
        break;
    }
  }

  std::string stuck() const {
    std::string out;
    for (std::size_t r = 0; r < next_.size(); ++r) {
      if (next_[r] == schedule_.actions[r].size()) continue;
      if (!out.empty()) out += ", ";
      out += fmt::format("rank {} waits at {}", r, to_string(schedule_.actions[r][next_[r]]));
    }
    return out;
  }

  SimulationResult result() {
    SimulationResult out;
    out.busy = busy_;
    for (const auto& rank_actions : done_) {
      for (const SimulatedAction& a : rank_actions) out.step_time = std::max(out.step_time, a.end);
    }
    for (const double busy : busy_) {
      // The window starts at 0, the first action's start (trace/pipeline_bubble.hpp).
      out.bubble_percent.push_back(trace::bubble_percent(busy, out.step_time));
    }
    for (auto& rank_actions : done_) {
      std::move(rank_actions.begin(), rank_actions.end(), std::back_inserter(out.actions));
    }
    out.peak_in_flight = peak_in_flight(schedule_);
    out.peak_activation_bytes = peak_activation_bytes(schedule_, costs_.activation_bytes);
    return out;
  }

  const Schedule& schedule_;
  const SimulationCosts& costs_;
  const bool lowered_;
  Progress progress_;
  std::vector<std::size_t> next_;  // per rank: the position of its next action
  std::vector<double> free_;       // per rank: when its last action ended
  std::vector<double> busy_;       // per rank: compute time so far
  std::vector<std::vector<SimulatedAction>> done_;
  std::deque<int> ready_ranks_;  // ranks to try, each at most once in it
  std::vector<char> queued_;     // per rank: whether it is in ready_ranks_
};

}  // namespace

double SimulationResult::mean_bubble_percent() const {
  if (bubble_percent.empty()) return 0;
  double sum = 0;
  for (const double b : bubble_percent) sum += b;
  return sum / static_cast<double>(bubble_percent.size());
}

SimulationResult simulate(const Schedule& schedule, const SimulationCosts& costs) {
  check_costs(costs);
  validate(schedule);
  return Walk(schedule, costs).run();
}

TextbookBubble textbook_bubble(const Schedule& schedule) {
  bool split = false;
  for (const auto& list : schedule.actions) {
    for (const Action& action : list) split = split || action.kind == ActionKind::backward_input;
  }
  const int ranks = std::max(schedule.ranks, 1);
  if (split) {
    const double idle = ranks - 1;
    return {100 * idle / (3.0 * schedule.microbatches + idle), "(p-1)/(3m+p-1)"};
  }
  const int virtual_stages = std::max(schedule.stages / ranks, 1);
  return {textbook_bubble_percent(ranks, schedule.microbatches, virtual_stages),
          virtual_stages > 1 ? "(p-1)/(v m+p-1)" : "(p-1)/(m+p-1)"};
}

double textbook_bubble_percent(int ranks, int microbatches, int virtual_stages) {
  if (ranks < 1 || microbatches < 1 || virtual_stages < 1) {
    invalid(fmt::format(
        "textbook bubble: ranks={}, microbatches={}, virtual_stages={}: each must be >= 1", ranks,
        microbatches, virtual_stages));
  }
  const double idle = ranks - 1;
  return 100 * idle / (static_cast<double>(virtual_stages) * microbatches + idle);
}

std::string chrome_trace_json(const Schedule& schedule, const SimulationResult& result) {
  using braid::append_json_string;
  std::string out = R"({"displayTimeUnit":"ms","traceEvents":[)";
  bool first = true;
  const auto separate = [&] {
    if (!first) out += ',';
    first = false;
  };
  for (int rank = 0; rank < schedule.ranks; ++rank) {
    separate();
    out += fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":)", rank);
    append_json_string(out, fmt::format("rank {} ({})", rank, schedule.name));
    out += "}}";
    separate();
    out += fmt::format(
        R"({{"name":"process_sort_index","ph":"M","pid":{},"args":{{"sort_index":{}}}}})", rank,
        rank);
    for (const auto& [tid, name] : {std::pair{0, "compute"}, std::pair{1, "transfers"}}) {
      separate();
      out += fmt::format(
          R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":"{}"}}}})", rank,
          tid, name);
    }
  }
  for (const SimulatedAction& a : result.actions) {
    separate();
    out += R"({"name":)";
    append_json_string(out, to_string(a.action));
    const bool transfer = is_communication(a.action.kind);
    out += fmt::format(
        R"(,"cat":"pipeline","ph":"X","pid":{},"tid":{},"ts":{},"dur":{},"args":{{"stage":{},"microbatch":{}}}}})",
        a.rank, transfer ? 1 : 0, a.begin, a.end - a.begin, a.action.stage, a.action.microbatch);
  }
  out += "]}\n";
  return out;
}

}  // namespace braid::parallel
