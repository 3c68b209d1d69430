// lower() (pipeline_schedule.hpp): a compute schedule's transfers and gradient reductions.
//
// First the whole pipeline is walked in one global order, round after round letting every
// rank run its next compute actions while their inputs (the previous stage's F, the next
// stage's B or I) are done. If a round passes with no rank moving, the compute schedule
// cannot run in any order of transfers, and lower() refuses it, naming what each rank
// waits for. Otherwise each rank's list gets a RECV right before the compute that uses
// it and a SEND right after the compute that produces it, so every receive's send comes
// earlier in that walk and, sends never blocking, the lowered schedule cannot deadlock.
// Cost: O(A log A) for A actions.
#include <cstddef>
#include <deque>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include <braid/parallel/pipeline_schedule.hpp>

#include "parallel/pipeline_schedule_checks.hpp"

namespace braid::parallel {
namespace {

using detail::StageOutput;

using OutputKey = std::tuple<int, bool, int>;  // stage, gradient, microbatch
OutputKey key_of(const StageOutput& output) {
  return {output.stage, output.gradient, output.microbatch};
}

// Refuses a compute schedule no order of transfers can run, naming each rank's blocked
// action and what it waits for.
void walk_global_order(const Schedule& compute) {
  std::set<OutputKey> done;
  std::vector<std::size_t> next(compute.ranks, 0);
  std::size_t remaining = 0;
  for (const auto& list : compute.actions) remaining += list.size();
  // A worklist: a rank runs until its next action waits for an output, and is tried again
  // only when a neighbouring stage (what its actions take input from) produces one, so the
  // walk costs O(actions log actions) rather than a pass over every rank per wave.
  std::deque<int> ready(compute.ranks);
  std::iota(ready.begin(), ready.end(), 0);
  std::vector<char> queued(compute.ranks, 1);
  const auto wake_neighbours = [&](int stage) {
    for (const int other : {stage - 1, stage + 1}) {
      if (other < 0 || other >= compute.stages) continue;
      const int rank = compute.stage_rank[other];
      if (rank < 0 || rank >= compute.ranks || queued[rank] != 0) continue;
      queued[rank] = 1;
      ready.push_back(rank);
    }
  };
  while (!ready.empty()) {
    const int rank = ready.front();
    ready.pop_front();
    queued[rank] = 0;
    const auto& list = compute.actions[rank];
    while (next[rank] < list.size()) {
      const Action& action = list[next[rank]];
      const auto input = detail::input_of(compute, action);
      if (input && !done.contains(key_of(*input))) break;
      if (const auto output = detail::output_of(action)) {
        done.insert(key_of(*output));
        wake_neighbours(action.stage);
      }
      ++next[rank];
      --remaining;
    }
  }
  if (remaining > 0) {
    std::vector<std::pair<int, int>> stuck;
    std::string waits;
    for (int rank = 0; rank < compute.ranks; ++rank) {
      if (next[rank] == compute.actions[rank].size()) continue;
      const Action& action = compute.actions[rank][next[rank]];
      const StageOutput input = *detail::input_of(compute, action);
      const Action producer{.stage = input.stage,
                            .kind = input.gradient ? ActionKind::backward : ActionKind::forward,
                            .microbatch = input.microbatch};
      stuck.emplace_back(rank, static_cast<int>(next[rank]));
      waits +=
          fmt::format("; rank {} position {}: {} waits for {}{}", rank, next[rank],
                      to_string(action), to_string(producer), input.gradient ? " (or its I)" : "");
    }
    detail::throw_schedule_error(
        compute,
        fmt::format("the compute schedule cannot run: no rank can take its next action{}", waits),
        stuck);
  }
}

}  // namespace

Schedule lower(const Schedule& compute, LowerOptions options) {
  for (int rank = 0; rank < static_cast<int>(compute.actions.size()); ++rank) {
    const auto& list = compute.actions[rank];
    for (int position = 0; position < static_cast<int>(list.size()); ++position) {
      if (is_compute(list[position].kind)) continue;
      detail::throw_schedule_error(
          compute,
          fmt::format("rank {} position {}: {}: lower() takes a compute schedule (F, B, I and W "
                      "only)",
                      rank, position, to_string(list[position])),
          {{rank, position}});
    }
  }
  detail::check_structure(compute);
  walk_global_order(compute);

  Schedule lowered = compute;
  for (int rank = 0; rank < compute.ranks; ++rank) {
    const auto& list = compute.actions[rank];
    // Where each stage's last backward action (B or W) is, for its REDUCE_GRAD.
    // A map, not a table of every stage: a rank holds a few of them.
    std::unordered_map<int, int> last_backward;
    for (int position = 0; position < static_cast<int>(list.size()); ++position) {
      const ActionKind kind = list[position].kind;
      if (kind == ActionKind::backward || kind == ActionKind::backward_weight) {
        last_backward[list[position].stage] = position;
      }
    }
    const auto on_other_rank = [&](int stage) {
      return stage >= 0 && stage < compute.stages && compute.stage_rank[stage] != rank;
    };
    std::vector<Action>& out = lowered.actions[rank];
    out.clear();
    for (int position = 0; position < static_cast<int>(list.size()); ++position) {
      const Action& action = list[position];
      const auto with = [&](ActionKind kind) {
        return Action{.stage = action.stage, .kind = kind, .microbatch = action.microbatch};
      };
      const bool forward = action.kind == ActionKind::forward;
      const bool input_gradient =
          action.kind == ActionKind::backward || action.kind == ActionKind::backward_input;
      if (forward && on_other_rank(action.stage - 1)) out.push_back(with(ActionKind::recv_forward));
      if (input_gradient && on_other_rank(action.stage + 1)) {
        out.push_back(with(ActionKind::recv_backward));
      }
      out.push_back(action);
      if (forward && on_other_rank(action.stage + 1)) out.push_back(with(ActionKind::send_forward));
      if (input_gradient && on_other_rank(action.stage - 1)) {
        out.push_back(with(ActionKind::send_backward));
      }
      const auto last = last_backward.find(action.stage);
      if (options.reduce_grad && last != last_backward.end() && last->second == position) {
        out.push_back(Action{.stage = action.stage, .kind = ActionKind::reduce_grad});
      }
    }
  }
  return lowered;
}

}  // namespace braid::parallel
