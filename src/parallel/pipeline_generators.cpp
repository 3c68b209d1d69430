// The compute schedules people run (pipeline_schedule.hpp), stage s on rank s % ranks.
//
// With p ranks, m microbatches, v virtual stages per rank and unit costs F = 1, B = 2
// (I = W = 1), the bubble (idle time over the step) of each rank is
//   GPipe and 1F1B:    (p-1) / (m+p-1), 1F1B keeping min(p-r, m) microbatches, GPipe m;
//   interleaved 1F1B:  (p-1) / (v m + p-1), for about (1 + (p-1)/(v p)) times 1F1B's memory;
//   ZB-H1:             about a third of 1F1B's, with 1F1B's peak memory (rank 0's, now on
//                      every rank): deferred weight gradients fill the idle slots.
// GPipe is there as the reference; 1F1B is the default; interleaved when m is a multiple
// of p and the extra transfers (v times as many) are cheap; ZB-H1 where B splits into I
// and W at no extra cost.
#include <algorithm>
#include <cctype>
#include <deque>
#include <string>

#include <fmt/format.h>

#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>
#include <braid/parallel/pipeline_schedule.hpp>

namespace braid::parallel {
namespace {

[[noreturn]] void refuse(const std::string& detail) {
  throw Error(Errc::invalid_argument, detail, ErrorContext{.operation = "pipeline schedule"});
}

void check_counts(std::string_view schedule, int ranks, int microbatches, int virtual_stages = 1) {
  if (ranks < 1) refuse(fmt::format("{} needs at least one rank, not {}", schedule, ranks));
  if (microbatches < 1) {
    refuse(fmt::format("{} needs at least one microbatch, not {}", schedule, microbatches));
  }
  // In 64 bits: ranks, virtual stages and microbatches are ints each, and their products
  // are what a wrong count makes huge.
  const std::int64_t stages = std::int64_t{ranks} * std::max(virtual_stages, 1);
  if (stages > kMaxStages) {
    refuse(fmt::format("{} with {} ranks x {} virtual stages is {} stages, past the limit of {}",
                       schedule, ranks, virtual_stages, stages, kMaxStages));
  }
  if (microbatches > kMaxMicrobatches) {
    refuse(fmt::format("{} with {} microbatches is past the limit of {}", schedule, microbatches,
                       kMaxMicrobatches));
  }
  // Three compute actions per stage and microbatch at most (F, I, W).
  if (const std::int64_t actions = 3 * stages * microbatches; actions > kMaxScheduleActions) {
    refuse(
        fmt::format("{} with {} stages x {} microbatches would hold {} actions, past the "
                    "limit of {}",
                    schedule, stages, microbatches, actions, kMaxScheduleActions));
  }
}

Schedule looped(std::string name, int ranks, int microbatches, int virtual_stages) {
  Schedule schedule{.name = std::move(name),
                    .ranks = ranks,
                    .stages = ranks * virtual_stages,
                    .microbatches = microbatches};
  for (int stage = 0; stage < schedule.stages; ++stage)
    schedule.stage_rank.push_back(stage % ranks);
  schedule.actions.resize(ranks);
  return schedule;
}

Action forward(int stage, int microbatch) {
  return {.stage = stage, .kind = ActionKind::forward, .microbatch = microbatch};
}
Action backward(int stage, int microbatch) {
  return {.stage = stage, .kind = ActionKind::backward, .microbatch = microbatch};
}

// Rank r's 1F1B order, with `backward_kind` for its backwards (B, or I for ZB-H1).
std::vector<Action> one_f_one_b_order(int ranks, int rank, int microbatches,
                                      ActionKind backward_kind) {
  const int warmup = std::min(ranks - 1 - rank, microbatches);
  std::vector<Action> order;
  const auto backward_of = [&](int microbatch) {
    return Action{.stage = rank, .kind = backward_kind, .microbatch = microbatch};
  };
  for (int mb = 0; mb < warmup; ++mb) order.push_back(forward(rank, mb));
  for (int mb = warmup; mb < microbatches; ++mb) {
    order.push_back(forward(rank, mb));
    order.push_back(backward_of(mb - warmup));
  }
  for (int mb = microbatches - warmup; mb < microbatches; ++mb) order.push_back(backward_of(mb));
  return order;
}

}  // namespace

Schedule gpipe(int ranks, int microbatches) {
  check_counts("GPipe", ranks, microbatches);
  Schedule schedule = looped("GPipe", ranks, microbatches, 1);
  for (int rank = 0; rank < ranks; ++rank) {
    for (int mb = 0; mb < microbatches; ++mb) schedule.actions[rank].push_back(forward(rank, mb));
    for (int mb = 0; mb < microbatches; ++mb) schedule.actions[rank].push_back(backward(rank, mb));
  }
  return schedule;
}

Schedule one_f_one_b(int ranks, int microbatches) {
  check_counts("1F1B", ranks, microbatches);
  Schedule schedule = looped("1F1B", ranks, microbatches, 1);
  for (int rank = 0; rank < ranks; ++rank) {
    schedule.actions[rank] = one_f_one_b_order(ranks, rank, microbatches, ActionKind::backward);
  }
  return schedule;
}

// Megatron-Core's forward_backward_pipelining_with_interleaving: rank r's k-th forward
// (of m v) runs chunk (k mod p v) / p on microbatch (k / p v) p + k mod p, so groups of p
// microbatches go through the chunks in ascending order; its k-th backward runs the
// chunks descending. (p - r - 1) 2 + (v - 1) p forwards warm up, then one forward and one
// backward alternate, then the backwards drain (no more warm-up than there are forwards:
// current Megatron-Core; earlier versions ran every forward first when m = p).
Schedule interleaved_one_f_one_b(int ranks, int microbatches, int virtual_stages) {
  check_counts("Interleaved1F1B", ranks, microbatches, virtual_stages);
  if (virtual_stages < 2) {
    refuse(
        fmt::format("Interleaved1F1B needs at least 2 virtual stages per rank, not {} (with "
                    "one, use 1F1B)",
                    virtual_stages));
  }
  if (microbatches % ranks != 0) {
    refuse(
        fmt::format("Interleaved1F1B needs microbatches a multiple of the ranks, as "
                    "Megatron-Core does: {} microbatches over {} ranks",
                    microbatches, ranks));
  }
  Schedule schedule = looped("Interleaved1F1B", ranks, microbatches, virtual_stages);
  const int total = microbatches * virtual_stages;
  const int group = ranks * virtual_stages;
  for (int rank = 0; rank < ranks; ++rank) {
    const auto microbatch_of = [&](int k) { return (k / group) * ranks + k % ranks; };
    const auto forward_k = [&](int k) {
      return forward((k % group) / ranks * ranks + rank, microbatch_of(k));
    };
    const auto backward_k = [&](int k) {
      const int chunk = virtual_stages - 1 - (k % group) / ranks;
      return backward(chunk * ranks + rank, microbatch_of(k));
    };
    const int warmup = std::min((ranks - rank - 1) * 2 + (virtual_stages - 1) * ranks, total);
    auto& order = schedule.actions[rank];
    for (int k = 0; k < warmup; ++k) order.push_back(forward_k(k));
    for (int k = 0; k < total - warmup; ++k) {
      order.push_back(forward_k(warmup + k));
      order.push_back(backward_k(k));
    }
    for (int k = total - warmup; k < total; ++k) order.push_back(backward_k(k));
  }
  return schedule;
}

// ZB-H1 (Qi et al. 2023, figure 3): each rank keeps 1F1B's order of forwards and input
// gradients (I), and at most min(p, m) microbatches in flight (an F holds one until its
// W): 1F1B's peak, which its rank 0 reaches, so the pipeline's peak memory is 1F1B's while
// the later ranks, which 1F1B holds to p - r, defer up to p - r - 1 more Ws. The order
// comes from playing the pipeline out in unit time (F = I = W = 1): at each step a rank
// runs its next F or I if its input is there and the bound allows, else its oldest
// deferred W, else it idles. So Ws fill what would be bubbles: the last rank runs F I
// p times before its first W, and the drain's idle slots run the Ws left over.
Schedule zero_bubble_h1(int ranks, int microbatches) {
  check_counts("ZBH1", ranks, microbatches);
  Schedule schedule = looped("ZBH1", ranks, microbatches, 1);
  constexpr int kNotYet = -1;
  // Per stage (= rank) and microbatch, the step its F and its I ended at.
  std::vector<std::vector<int>> forward_done(ranks, std::vector<int>(microbatches, kNotYet));
  std::vector<std::vector<int>> input_done(ranks, std::vector<int>(microbatches, kNotYet));
  const auto done_before = [](int step_done, int step) {
    return step_done != kNotYet && step_done < step;
  };
  struct RankState {
    std::vector<Action> order;  // F and I, 1F1B's order
    std::size_t next = 0;
    std::deque<int> deferred;  // microbatches whose W waits
    int in_flight = 0;
  };
  std::vector<RankState> state(ranks);
  const int limit = std::min(ranks, microbatches);
  std::size_t remaining = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    state[rank].order = one_f_one_b_order(ranks, rank, microbatches, ActionKind::backward_input);
    remaining += 3 * static_cast<std::size_t>(microbatches);
  }
  for (int step = 0; remaining > 0; ++step) {
    // Some rank runs something at every step, or every rank would wait forever.
    BRAID_ENFORCE(step <= 3 * microbatches * ranks, "ZB-H1 generation stalled at step {}", step);
    for (int rank = 0; rank < ranks; ++rank) {
      RankState& me = state[rank];
      std::optional<Action> run;
      if (me.next < me.order.size()) {
        const Action& candidate = me.order[me.next];
        const int mb = candidate.microbatch;
        const bool ready = candidate.kind == ActionKind::forward
                               ? (rank == 0 || done_before(forward_done[rank - 1][mb], step)) &&
                                     me.in_flight < limit
                               : rank == ranks - 1 || done_before(input_done[rank + 1][mb], step);
        if (ready) run = candidate;
      }
      if (run) {
        ++me.next;
        if (run->kind == ActionKind::forward) {
          forward_done[rank][run->microbatch] = step;
          ++me.in_flight;
        } else {
          input_done[rank][run->microbatch] = step;
          me.deferred.push_back(run->microbatch);
        }
      } else if (!me.deferred.empty()) {
        run = Action{
            .stage = rank, .kind = ActionKind::backward_weight, .microbatch = me.deferred.front()};
        me.deferred.pop_front();
        --me.in_flight;
      }
      if (run) {
        schedule.actions[rank].push_back(*run);
        --remaining;
      }
    }
  }
  return schedule;
}

Schedule make_schedule(std::string_view name, int ranks, int microbatches, int virtual_stages) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "interleaved") return interleaved_one_f_one_b(ranks, microbatches, virtual_stages);
  if (lower != "gpipe" && lower != "1f1b" && lower != "zb") {
    refuse(
        fmt::format("no pipeline schedule '{}' (the schedules are gpipe, 1f1b, interleaved "
                    "and zb)",
                    name));
  }
  if (virtual_stages != 1) {
    refuse(
        fmt::format("the {} schedule runs one stage per rank, not {} (virtual stages are "
                    "for 'interleaved')",
                    lower, virtual_stages));
  }
  if (lower == "gpipe") return gpipe(ranks, microbatches);
  if (lower == "1f1b") return one_f_one_b(ranks, microbatches);
  return zero_bubble_h1(ranks, microbatches);
}

}  // namespace braid::parallel
