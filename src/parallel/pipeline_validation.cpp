// validate() (pipeline_schedule.hpp) and the structural checks lower() shares with it.
//
// Three passes, each naming the first offending action in rank-then-position order and
// printing the grid with it marked: the structure (placement, one F and one backward per
// stage and microbatch, each in order on its rank), the transfers (each send's receive,
// each receive's send, each cross-rank input received before it is used), and the
// happens-before graph's acyclicity by Kahn's algorithm. O(A log A) for A actions.
#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include <braid/parallel/pipeline_schedule.hpp>

#include "parallel/pipeline_schedule_checks.hpp"

namespace braid::parallel {
namespace {

using detail::throw_schedule_error;

struct Place {
  int rank = -1;
  int position = -1;
  bool found() const { return position >= 0; }
};

// Where a (stage, microbatch)'s compute actions sit; all on the stage's rank.
struct ComputePlaces {
  Place forward, backward, input, weight;
  Place* of(ActionKind kind) {
    switch (kind) {
      case ActionKind::forward:
        return &forward;
      case ActionKind::backward:
        return &backward;
      case ActionKind::backward_input:
        return &input;
      case ActionKind::backward_weight:
        return &weight;
      default:
        return nullptr;
    }
  }
  // B, or I where the backward is split: what hands the gradient to the previous stage.
  Place input_gradient() const { return backward.found() ? backward : input; }
};

using StageMicrobatch = std::pair<int, int>;

std::string at(int rank, int position, const Action& action) {
  return fmt::format("rank {} position {}: {}", rank, position, to_string(action));
}

void check_shape(const Schedule& s) {
  const auto refuse = [&](const std::string& why) { throw_schedule_error(s, why); };
  if (s.ranks < 1) refuse(fmt::format("{} ranks: a schedule needs at least one", s.ranks));
  if (s.stages < 1) refuse(fmt::format("{} stages: a schedule needs at least one", s.stages));
  if (s.microbatches < 1) {
    refuse(fmt::format("{} microbatches: a schedule needs at least one", s.microbatches));
  }
  if (static_cast<int>(s.actions.size()) != s.ranks) {
    refuse(fmt::format("{} ranks but {} action lists", s.ranks, s.actions.size()));
  }
  if (static_cast<int>(s.stage_rank.size()) != s.stages) {
    refuse(fmt::format("{} stages but stage_rank places {}", s.stages, s.stage_rank.size()));
  }
  for (int stage = 0; stage < s.stages; ++stage) {
    const int rank = s.stage_rank[stage];
    if (rank < 0 || rank >= s.ranks) {
      refuse(fmt::format("stage {} is on no rank (stage_rank says {}, the ranks are 0..{})", stage,
                         rank, s.ranks - 1));
    }
  }
}

// Each action's stage and microbatch in range and on its stage's rank; no compute action
// twice; B never beside I or W for one microbatch. Returns where each compute action is.
std::map<StageMicrobatch, ComputePlaces> place_compute(const Schedule& s) {
  std::map<StageMicrobatch, ComputePlaces> places;
  for (int rank = 0; rank < s.ranks; ++rank) {
    const auto& list = s.actions[rank];
    for (int position = 0; position < static_cast<int>(list.size()); ++position) {
      const Action& a = list[position];
      const auto refuse = [&](const std::string& why) {
        throw_schedule_error(s, fmt::format("{}: {}", at(rank, position, a), why),
                             {{rank, position}});
      };
      if (a.stage < 0 || a.stage >= s.stages) {
        refuse(fmt::format("no stage {} (the stages are 0..{})", a.stage, s.stages - 1));
      }
      if (a.kind == ActionKind::reduce_grad) {
        if (a.microbatch != -1) refuse("REDUCE_GRAD has no microbatch (-1)");
      } else if (a.microbatch < 0 || a.microbatch >= s.microbatches) {
        refuse(fmt::format("no microbatch {} (the microbatches are 0..{})", a.microbatch,
                           s.microbatches - 1));
      }
      if (s.stage_rank[a.stage] != rank) {
        refuse(fmt::format("stage {} runs on rank {}, and a stage runs on one rank", a.stage,
                           s.stage_rank[a.stage]));
      }
      if (!is_compute(a.kind)) continue;
      ComputePlaces& mine = places[{a.stage, a.microbatch}];
      Place* slot = mine.of(a.kind);
      if (slot->found())
        refuse(fmt::format("a second time (first at position {})", slot->position));
      const bool split =
          a.kind == ActionKind::backward_input || a.kind == ActionKind::backward_weight;
      if ((split && mine.backward.found()) ||
          (a.kind == ActionKind::backward && (mine.input.found() || mine.weight.found()))) {
        refuse(
            fmt::format("stage {} microbatch {} already has a backward of the other form "
                        "(a microbatch's backward is B, or I and W)",
                        a.stage, a.microbatch));
      }
      *slot = Place{rank, position};
    }
  }
  return places;
}

void check_complete(const Schedule& s, std::map<StageMicrobatch, ComputePlaces>& places) {
  for (int stage = 0; stage < s.stages; ++stage) {
    for (int microbatch = 0; microbatch < s.microbatches; ++microbatch) {
      ComputePlaces& p = places[{stage, microbatch}];
      const auto missing = [&](ActionKind kind, std::string_view why) {
        throw_schedule_error(
            s, fmt::format(
                   "{} is missing: {}",
                   to_string(Action{.stage = stage, .kind = kind, .microbatch = microbatch}), why));
      };
      if (!p.forward.found()) missing(ActionKind::forward, "every stage forwards every microbatch");
      if (!p.backward.found() && !p.input.found() && !p.weight.found()) {
        missing(ActionKind::backward,
                "every stage runs a backward (B, or I and W) of every microbatch");
      }
      if (p.weight.found() && !p.input.found()) {
        missing(ActionKind::backward_input, "a W needs the I of its microbatch");
      }
      if (p.input.found() && !p.weight.found()) {
        missing(ActionKind::backward_weight, "an I needs the W of its microbatch");
      }
    }
  }
}

// Backward after F, W after I, REDUCE_GRAD once and after its stage's last backward.
void check_order(const Schedule& s, std::map<StageMicrobatch, ComputePlaces>& places) {
  std::vector<int> last_backward(s.stages, -1);
  for (const auto& [key, p] : places) {
    last_backward[key.first] =
        std::max({last_backward[key.first], p.backward.position, p.weight.position});
  }
  std::vector<int> reduced_at(s.stages, -1);
  for (int rank = 0; rank < s.ranks; ++rank) {
    const auto& list = s.actions[rank];
    for (int position = 0; position < static_cast<int>(list.size()); ++position) {
      const Action& a = list[position];
      const auto refuse = [&](const std::string& why) {
        throw_schedule_error(s, fmt::format("{} {}", at(rank, position, a), why),
                             {{rank, position}});
      };
      const auto named = [&](ActionKind kind) {
        return to_string(Action{.stage = a.stage, .kind = kind, .microbatch = a.microbatch});
      };
      if (a.kind == ActionKind::reduce_grad) {
        if (reduced_at[a.stage] >= 0) {
          refuse(fmt::format("a second time (first at position {})", reduced_at[a.stage]));
        }
        reduced_at[a.stage] = position;
        if (last_backward[a.stage] > position) {
          refuse(
              fmt::format("before {} (position {}): the reduction follows the stage's last "
                          "backward",
                          to_string(list[last_backward[a.stage]]), last_backward[a.stage]));
        }
        continue;
      }
      if (!is_compute(a.kind)) continue;
      const ComputePlaces& p = places[{a.stage, a.microbatch}];
      if ((a.kind == ActionKind::backward || a.kind == ActionKind::backward_input ||
           a.kind == ActionKind::backward_weight) &&
          p.forward.position > position) {
        refuse(fmt::format("before {}", named(ActionKind::forward)));
      }
      if (a.kind == ActionKind::backward_weight && p.input.position > position) {
        refuse(fmt::format("before {}", named(ActionKind::backward_input)));
      }
    }
  }
}

// The transfer that carries `kind`'s data and the stage at its other end.
struct TransferEnds {
  ActionKind matching;  // the other end's kind
  int peer_stage;       // the other end's stage
};
std::optional<TransferEnds> ends_of(const Schedule& s, const Action& a) {
  switch (a.kind) {
    case ActionKind::send_forward:
      if (a.stage + 1 >= s.stages) return std::nullopt;
      return TransferEnds{ActionKind::recv_forward, a.stage + 1};
    case ActionKind::recv_forward:
      if (a.stage == 0) return std::nullopt;
      return TransferEnds{ActionKind::send_forward, a.stage - 1};
    case ActionKind::send_backward:
      if (a.stage == 0) return std::nullopt;
      return TransferEnds{ActionKind::recv_backward, a.stage - 1};
    case ActionKind::recv_backward:
      if (a.stage + 1 >= s.stages) return std::nullopt;
      return TransferEnds{ActionKind::send_backward, a.stage + 1};
    default:
      return std::nullopt;
  }
}

using TransferKey = std::tuple<ActionKind, int, int>;  // kind, stage, microbatch

// Each transfer once, between stages on two ranks, matched by its other end, a send after
// the compute that produces its data and a receive before the compute that uses it; where
// the schedule holds transfers, every input that crosses ranks is received. Returns where
// each transfer is.
std::map<TransferKey, Place> check_transfers(const Schedule& s,
                                             std::map<StageMicrobatch, ComputePlaces>& places) {
  std::map<TransferKey, Place> transfers;
  for (int rank = 0; rank < s.ranks; ++rank) {
    const auto& list = s.actions[rank];
    for (int position = 0; position < static_cast<int>(list.size()); ++position) {
      const Action& a = list[position];
      if (!is_communication(a.kind)) continue;
      auto [it, fresh] =
          transfers.try_emplace({a.kind, a.stage, a.microbatch}, Place{rank, position});
      if (!fresh) {
        throw_schedule_error(s,
                             fmt::format("{} a second time (first at position {})",
                                         at(rank, position, a), it->second.position),
                             {{rank, position}});
      }
    }
  }
  const bool has_transfers = !transfers.empty();
  for (int rank = 0; rank < s.ranks; ++rank) {
    const auto& list = s.actions[rank];
    for (int position = 0; position < static_cast<int>(list.size()); ++position) {
      const Action& a = list[position];
      const auto refuse = [&](const std::string& why) {
        throw_schedule_error(s, fmt::format("{} {}", at(rank, position, a), why),
                             {{rank, position}});
      };
      if (is_compute(a.kind)) {
        const auto input = detail::input_of(s, a);
        if (!has_transfers || !input || s.stage_rank[input->stage] == rank) continue;
        const ActionKind recv =
            input->gradient ? ActionKind::recv_backward : ActionKind::recv_forward;
        const Action needed{.stage = a.stage, .kind = recv, .microbatch = a.microbatch};
        const auto found = transfers.find({recv, a.stage, a.microbatch});
        if (found == transfers.end()) {
          refuse(fmt::format("has no {} before it: its input comes from rank {}", to_string(needed),
                             s.stage_rank[input->stage]));
        }
        continue;
      }
      if (!is_communication(a.kind)) continue;
      const auto ends = ends_of(s, a);
      if (!ends) {
        refuse(fmt::format("has no other end: stage {} has no {} neighbour", a.stage,
                           a.kind == ActionKind::send_forward || a.kind == ActionKind::recv_backward
                               ? "next"
                               : "previous"));
      }
      const int peer_rank = s.stage_rank[ends->peer_stage];
      if (peer_rank == rank) {
        refuse(
            fmt::format("between stages {} and {}, which both run on rank {}: they pass "
                        "tensors in memory",
                        a.stage, ends->peer_stage, rank));
      }
      const Action other{
          .stage = ends->peer_stage, .kind = ends->matching, .microbatch = a.microbatch};
      const bool sends = a.kind == ActionKind::send_forward || a.kind == ActionKind::send_backward;
      if (!transfers.contains({other.kind, other.stage, other.microbatch})) {
        refuse(fmt::format("has no {} on rank {} ({})", to_string(other), peer_rank,
                           sends ? "a send with no receive" : "a receive with no matching send"));
      }
      // The compute on this rank that produces (for a send) or uses (for a receive) the data.
      const bool forward = a.kind == ActionKind::send_forward || a.kind == ActionKind::recv_forward;
      const ComputePlaces& p = places[{a.stage, a.microbatch}];
      const Place compute = forward ? p.forward : p.input_gradient();
      const Action compute_action = list[compute.position];
      if (sends && compute.position > position) {
        refuse(fmt::format("before {}, whose result it sends", to_string(compute_action)));
      }
      if (!sends && compute.position < position) {
        refuse(fmt::format("after {}, which needs it", to_string(compute_action)));
      }
    }
  }
  return transfers;
}

// Kahn's algorithm over every action: each rank's order, each send before its receive,
// each stage's compute after the neighbouring compute it takes its input from.
void check_acyclic(const Schedule& s, std::map<StageMicrobatch, ComputePlaces>& places,
                   const std::map<TransferKey, Place>& transfers) {
  std::vector<int> offset(s.ranks + 1, 0);
  for (int rank = 0; rank < s.ranks; ++rank) {
    offset[rank + 1] = offset[rank] + static_cast<int>(s.actions[rank].size());
  }
  const auto node = [&](Place place) { return offset[place.rank] + place.position; };
  std::vector<std::vector<int>> successors(offset.back());
  std::vector<int> waiting_on(offset.back(), 0);
  const auto edge = [&](int from, int to) {
    successors[from].push_back(to);
    ++waiting_on[to];
  };
  for (int rank = 0; rank < s.ranks; ++rank) {
    const auto& list = s.actions[rank];
    for (int position = 0; position < static_cast<int>(list.size()); ++position) {
      const Action& a = list[position];
      const int me = offset[rank] + position;
      if (position > 0) edge(me - 1, me);
      if (a.kind == ActionKind::send_forward || a.kind == ActionKind::send_backward) {
        const auto ends = ends_of(s, a);
        edge(me, node(transfers.at({ends->matching, ends->peer_stage, a.microbatch})));
      }
      if (const auto input = detail::input_of(s, a)) {
        const ComputePlaces& p = places[{input->stage, input->microbatch}];
        edge(node(input->gradient ? p.input_gradient() : p.forward), me);
      }
    }
  }
  std::vector<int> ready;
  for (int n = 0; n < offset.back(); ++n) {
    if (waiting_on[n] == 0) ready.push_back(n);
  }
  int done = 0;
  while (!ready.empty()) {
    const int n = ready.back();
    ready.pop_back();
    ++done;
    for (int next : successors[n]) {
      if (--waiting_on[next] == 0) ready.push_back(next);
    }
  }
  if (done == offset.back()) return;
  // Each rank stops at its first action that never became ready.
  std::vector<std::pair<int, int>> stuck;
  std::string names;
  for (int rank = 0; rank < s.ranks; ++rank) {
    for (int position = 0; position < static_cast<int>(s.actions[rank].size()); ++position) {
      if (waiting_on[offset[rank] + position] == 0) continue;
      stuck.emplace_back(rank, position);
      names += fmt::format("{}{}", names.empty() ? "" : ", ",
                           at(rank, position, s.actions[rank][position]));
      break;
    }
  }
  throw_schedule_error(
      s,
      fmt::format("{} waits on itself through other ranks (a cycle in the happens-before graph: "
                  "the schedule deadlocks); stuck: {}",
                  at(stuck.front().first, stuck.front().second,
                     s.actions[stuck.front().first][stuck.front().second]),
                  names),
      stuck);
}

}  // namespace

namespace detail {

std::optional<StageOutput> output_of(const Action& action) {
  switch (action.kind) {
    case ActionKind::forward:
      return StageOutput{action.stage, false, action.microbatch};
    case ActionKind::backward:
    case ActionKind::backward_input:
      return StageOutput{action.stage, true, action.microbatch};
    default:
      return std::nullopt;
  }
}

std::optional<StageOutput> input_of(const Schedule& schedule, const Action& action) {
  switch (action.kind) {
    case ActionKind::forward:
      if (action.stage == 0) return std::nullopt;
      return StageOutput{action.stage - 1, false, action.microbatch};
    case ActionKind::backward:
    case ActionKind::backward_input:
      if (action.stage + 1 >= schedule.stages) return std::nullopt;
      return StageOutput{action.stage + 1, true, action.microbatch};
    default:
      return std::nullopt;
  }
}

void check_structure(const Schedule& schedule) {
  check_shape(schedule);
  auto places = place_compute(schedule);
  check_complete(schedule, places);
  check_order(schedule, places);
}

}  // namespace detail

void validate(const Schedule& schedule) {
  check_shape(schedule);
  auto places = place_compute(schedule);
  check_complete(schedule, places);
  check_order(schedule, places);
  const auto transfers = check_transfers(schedule, places);
  check_acyclic(schedule, places, transfers);
}

}  // namespace braid::parallel
