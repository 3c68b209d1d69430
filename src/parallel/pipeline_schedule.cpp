// Pipeline actions in PyTorch's text form, the schedule's grid and its peak activations
// (pipeline_schedule.hpp). Generators, lowering, validation and CSV have files of their own.
#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <set>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/core/excerpt.hpp>
#include <braid/parallel/pipeline_schedule.hpp>

#include "parallel/pipeline_schedule_checks.hpp"

namespace braid::parallel {
namespace {

constexpr std::array kAllKinds = {
    ActionKind::forward,         ActionKind::backward,      ActionKind::backward_input,
    ActionKind::backward_weight, ActionKind::send_forward,  ActionKind::recv_forward,
    ActionKind::send_backward,   ActionKind::recv_backward, ActionKind::reduce_grad,
};

// Leading decimal digits of `text` as a number below 10^9, consumed from `text`.
std::optional<int> take_number(std::string_view& text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 9) return std::nullopt;
  int value = 0;
  std::from_chars(text.data(), text.data() + digits, value);
  text.remove_prefix(digits);
  return value;
}

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

}  // namespace

std::string_view to_string(ActionKind kind) noexcept {
  switch (kind) {
    case ActionKind::forward:
      return "F";
    case ActionKind::backward:
      return "B";
    case ActionKind::backward_input:
      return "I";
    case ActionKind::backward_weight:
      return "W";
    case ActionKind::send_forward:
      return "SEND_F";
    case ActionKind::recv_forward:
      return "RECV_F";
    case ActionKind::send_backward:
      return "SEND_B";
    case ActionKind::recv_backward:
      return "RECV_B";
    case ActionKind::reduce_grad:
      return "REDUCE_GRAD";
  }
  return "?";
}

bool is_compute(ActionKind kind) noexcept {
  return kind == ActionKind::forward || kind == ActionKind::backward ||
         kind == ActionKind::backward_input || kind == ActionKind::backward_weight;
}

bool is_communication(ActionKind kind) noexcept {
  return kind == ActionKind::send_forward || kind == ActionKind::recv_forward ||
         kind == ActionKind::send_backward || kind == ActionKind::recv_backward;
}

std::string to_string(const Action& action) {
  if (action.kind == ActionKind::reduce_grad) {
    return fmt::format("{}{}", action.stage, to_string(action.kind));
  }
  return fmt::format("{}{}{}", action.stage, to_string(action.kind), action.microbatch);
}

// PyTorch's _Action.from_str reads (\d+)(F|I|B|W|SEND_F|...|REDUCE_GRAD)(\d*) after
// stripping blanks; here the whole text must match, and only REDUCE_GRAD goes without a
// microbatch (PyTorch would take "0F" as a forward of no microbatch, which nothing runs).
Action parse_action(std::string_view text) {
  const auto refuse = [&](std::string_view why) -> Action {
    throw Error(Errc::invalid_argument,
                fmt::format("'{}' is not a pipeline action ({}; actions read like 0F1, 1B0, "
                            "2I3, 2W3, 0SEND_F1, 1RECV_B2, 3REDUCE_GRAD)",
                            excerpt(text), why),
                ErrorContext{.operation = "pipeline schedule"});
  };
  std::string_view rest = trim(text);
  const auto stage = take_number(rest);
  if (!stage) return refuse("no stage number first");
  std::optional<ActionKind> kind;
  std::size_t kind_length = 0;
  for (ActionKind candidate : kAllKinds) {
    const std::string_view name = to_string(candidate);
    if (rest.starts_with(name) && name.size() > kind_length) {
      kind = candidate;
      kind_length = name.size();
    }
  }
  if (!kind) return refuse("no action kind after the stage");
  rest.remove_prefix(kind_length);
  if (*kind == ActionKind::reduce_grad) {
    if (!rest.empty()) return refuse("REDUCE_GRAD takes no microbatch");
    return Action{.stage = *stage, .kind = *kind, .microbatch = -1};
  }
  const auto microbatch = take_number(rest);
  if (!microbatch) return refuse("no microbatch number after the kind");
  if (!rest.empty()) return refuse("text after the microbatch");
  return Action{.stage = *stage, .kind = *kind, .microbatch = *microbatch};
}

std::vector<int> Schedule::stages_of(int rank) const {
  std::vector<int> held;
  for (int stage = 0; stage < static_cast<int>(stage_rank.size()); ++stage) {
    if (stage_rank[stage] == rank) held.push_back(stage);
  }
  return held;
}

bool Schedule::lowered() const {
  for (const auto& list : actions) {
    for (const Action& action : list) {
      if (!is_compute(action.kind)) return true;
    }
  }
  return false;
}

std::string grid_text(const Schedule& schedule, const std::vector<std::pair<int, int>>& marked,
                      bool compute_only) {
  const std::set<std::pair<int, int>> marks(marked.begin(), marked.end());
  const auto shown = [&](const Action& action) { return !compute_only || is_compute(action.kind); };
  std::size_t width = 1;
  std::size_t longest_row = 0;
  for (const auto& list : schedule.actions) {
    longest_row = std::max(longest_row, list.size());
    for (const Action& action : list) {
      if (shown(action)) width = std::max(width, to_string(action).size());
    }
  }
  const std::string widest_label = fmt::format("rank {}", schedule.actions.size());
  const std::size_t label_width = widest_label.size() + 1;
  std::string out;
  const auto end_line = [&out] {
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += '\n';
  };
  if (!compute_only) {
    // Column numbers are positions in each rank's list, as error messages name them.
    out += fmt::format("{:<{}}", "", label_width);
    for (std::size_t position = 0; position < longest_row; ++position) {
      out += fmt::format(" {:<{}} ", position, width + 1);
    }
    end_line();
  }
  for (std::size_t rank = 0; rank < schedule.actions.size(); ++rank) {
    out += fmt::format("{:<{}}", fmt::format("rank {}", rank), label_width);
    const auto& list = schedule.actions[rank];
    for (std::size_t position = 0; position < list.size(); ++position) {
      if (!shown(list[position])) continue;
      const bool mark = marks.contains({static_cast<int>(rank), static_cast<int>(position)});
      const std::string text = to_string(list[position]);
      out += fmt::format("{:<{}} ", mark ? '>' + text + '<' : ' ' + text + ' ', width + 2);
    }
    end_line();
  }
  return out;
}

std::vector<int> peak_in_flight(const Schedule& schedule) {
  std::vector<int> peaks;
  peaks.reserve(schedule.actions.size());
  for (const auto& list : schedule.actions) {
    int held = 0;
    int peak = 0;
    for (const Action& action : list) {
      if (action.kind == ActionKind::forward) peak = std::max(peak, ++held);
      // B and W release the activations F kept; I leaves them for its W.
      if (action.kind == ActionKind::backward || action.kind == ActionKind::backward_weight) {
        --held;
      }
    }
    peaks.push_back(peak);
  }
  return peaks;
}

std::vector<std::uint64_t> peak_activation_bytes(const Schedule& schedule,
                                                 std::uint64_t bytes_per_microbatch_stage) {
  std::vector<std::uint64_t> bytes;
  for (int peak : peak_in_flight(schedule)) {
    bytes.push_back(static_cast<std::uint64_t>(peak) * bytes_per_microbatch_stage);
  }
  return bytes;
}

namespace detail {

void throw_schedule_error(const Schedule& schedule, const std::string& detail,
                          const std::vector<std::pair<int, int>>& marked) {
  throw Error(Errc::invalid_argument, fmt::format("{}\n{}", detail, grid_text(schedule, marked)),
              ErrorContext{.operation = "pipeline schedule"});
}

}  // namespace detail
}  // namespace braid::parallel
