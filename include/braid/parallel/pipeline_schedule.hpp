// Pipeline schedules as data: every rank's list of actions (forward, backward, the sends
// and receives between stages, the data-parallel gradient reduction), generated for the
// schedules people run, checked before anything runs, and readable and writable in
// PyTorch's text and CSV forms (torch.distributed.pipelining's _Action), so schedules can be
// exchanged with it.
//
//   auto schedule = braid::parallel::lower(braid::parallel::one_f_one_b(4, 8));
//   braid::parallel::validate(schedule);            // throws, with the grid, if it cannot run
//   std::cout << braid::parallel::grid_text(schedule);
//
// An action is (stage, kind, microbatch), written as PyTorch writes it: "0F1" (stage 0,
// forward, microbatch 1), "1B0", "2I3", "2W3", "0SEND_F1", "1RECV_B2", "3REDUCE_GRAD".
// Stages are numbered 0..S-1 from the model's input to its loss; rank r runs the stages
// stage_rank maps to it, in the order of its list.
//
// Two forms. A compute schedule holds F, B, I and W only. lower() adds the transfers: after
// each F whose next stage lives on another rank, a SEND_F there and a RECV_F on that rank
// before its F of the same microbatch; likewise SEND_B / RECV_B for the gradients flowing
// back (after B, or after I where B is split). Adjacent stages on one rank pass tensors
// in memory: no transfer. With reduce_grad, each stage gets a REDUCE_GRAD after its last
// backward action (B or W) on its rank. The transfers are placed by walking the whole
// pipeline in one global order (every rank advancing while its next action can run), so
// a lowered schedule that validates cannot deadlock at run time: sends never block (they
// complete in the background) and every receive's send happens before it in that order.
//
// Validation (validate()) refuses, before anything runs: a stage without exactly one F and
// one backward (B, or I and W) for every microbatch; a backward before its F on that
// stage; a W before its I; a stage on two ranks or none; an action whose stage the rank
// does not hold; a receive with no matching send, or a send with no receive; and a
// happens-before graph (each rank's order, plus each send before its receive, plus each
// stage's F of a microbatch after the previous stage's F of it and its backward after the
// next stage's) that has a cycle: a deadlock. The Error's message prints the rank-by-time
// grid (grid_text) with the offending action marked.
//
// Costs: every function here is arithmetic on the lists, O(actions) or O(actions log
// actions); the validation's cycle check is linear in actions plus edges.
//
// Limits, checked before anything is built or allocated (an Error(invalid_argument) naming
// the counts and the limit): at most kMaxStages stages (ranks x virtual stages), kMaxMicrobatches
// microbatches and kMaxScheduleActions compute actions. A CSV is held to the same, each
// number in it checked as it is read. They are far past any model (a stage is at least a
// layer) and keep a mistyped count from taking all memory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace braid::parallel {

inline constexpr std::int64_t kMaxStages = 4096;
inline constexpr std::int64_t kMaxMicrobatches = std::int64_t{1} << 20;
inline constexpr std::int64_t kMaxScheduleActions = std::int64_t{1} << 22;

enum class ActionKind : std::uint8_t {
  forward,          // F
  backward,         // B: the input and the weight gradients together
  backward_input,   // I: the gradient of the stage's input alone (zero-bubble schedules)
  backward_weight,  // W: the weight gradients, after the stage's I of the same microbatch
  send_forward,     // SEND_F: this stage's output to the rank of the next stage
  recv_forward,     // RECV_F: this stage's input from the rank of the previous stage
  send_backward,    // SEND_B: the gradient of this stage's input, to the previous stage's rank
  recv_backward,    // RECV_B: the gradient of this stage's output, from the next stage's rank
  reduce_grad,      // REDUCE_GRAD: this stage's data-parallel gradient reduction (no microbatch)
};

// "F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE_GRAD".
std::string_view to_string(ActionKind kind) noexcept;
bool is_compute(ActionKind kind) noexcept;        // F, B, I, W
bool is_communication(ActionKind kind) noexcept;  // SEND_*, RECV_*

struct Action {
  int stage = 0;
  ActionKind kind = ActionKind::forward;
  int microbatch = -1;  // -1 for REDUCE_GRAD, which has none
  friend bool operator==(const Action&, const Action&) = default;
};

// PyTorch's text form: "<stage><kind><microbatch>", e.g. "0F1", "3REDUCE_GRAD".
std::string to_string(const Action& action);
// Throws Error(invalid_argument) naming the text for anything else.
Action parse_action(std::string_view text);

struct Schedule {
  std::string name;  // "GPipe", "1F1B", "Interleaved1F1B", "ZBH1", or where it came from
  int ranks = 0;
  int stages = 0;  // ranks x virtual stages per rank
  int microbatches = 0;
  std::vector<int> stage_rank;               // stage -> the rank that runs it
  std::vector<std::vector<Action>> actions;  // per rank, in the order it runs them

  // The stages rank `rank` holds, ascending.
  std::vector<int> stages_of(int rank) const;
  // Whether it holds transfers (lower()'s output) or compute alone.
  bool lowered() const;
};

// ---- generators: compute schedules, stage s on rank s % ranks ("loop" placement)
// Each throws Error(invalid_argument) for ranks < 1, microbatches < 1, or what the
// schedule cannot take (named in the message).

// All forwards, then all backwards (B). Peak in flight: m per rank.
Schedule gpipe(int ranks, int microbatches);
// One forward, one backward (PipeDream-flush, Megatron-Core's default): rank r runs
// min(ranks - 1 - r, m) warm-up forwards, then alternates, then drains. Peak in flight:
// min(ranks - r, m).
Schedule one_f_one_b(int ranks, int microbatches);
// Megatron-Core's interleaved 1F1B: `virtual_stages` (v >= 2) stages per rank, stage
// s = chunk x ranks + r on rank r; microbatches a multiple of ranks (as Megatron-Core asks).
Schedule interleaved_one_f_one_b(int ranks, int microbatches, int virtual_stages);
// Zero-bubble ZB-H1 (Qi et al. 2023): 1F1B with B split into I and W, the Ws deferred to
// fill the bubbles; the same peak memory as 1F1B, min(ranks, m) microbatches in flight,
// which 1F1B's rank 0 holds and here every rank may (1F1B's rank r holds min(ranks - r, m)).
Schedule zero_bubble_h1(int ranks, int microbatches);
// By name, as the tools and examples take it: "gpipe", "1f1b", "interleaved" (with
// virtual_stages), "zb" (ZB-H1); an unknown name is an Error(invalid_argument) listing them.
Schedule make_schedule(std::string_view name, int ranks, int microbatches, int virtual_stages = 1);

struct LowerOptions {
  bool reduce_grad = false;  // a REDUCE_GRAD per stage after its last backward action
};
// Adds the transfers (and REDUCE_GRAD) to a compute schedule (see above). Throws
// Error(invalid_argument), with the grid, where the compute schedule cannot run at all.
Schedule lower(const Schedule& compute, LowerOptions options = {});

// Throws Error(invalid_argument) for a schedule that cannot run (see above), the message
// naming the offending action and printing the grid with it marked.
void validate(const Schedule& schedule);

// The rank-by-time grid: one row per rank, one column per position in its list, each cell
// the action's text; `marked` (rank, position in that rank's list) cells stand out
// between '>' and '<'. Compute-only rows when compute_only (transfers left out).
std::string grid_text(const Schedule& schedule, const std::vector<std::pair<int, int>>& marked = {},
                      bool compute_only = false);

// Per rank, the largest number of (stage, microbatch) pairs forwarded and not yet released
// at any point of its list: F holds one; B releases it, and where B is split, W does (the
// weight gradient still needs the stage's saved activations).
std::vector<int> peak_in_flight(const Schedule& schedule);
// The activation memory that peak implies, per rank, for `bytes_per_microbatch_stage`
// (what one stage keeps for backward of one microbatch).
std::vector<std::uint64_t> peak_activation_bytes(const Schedule& schedule,
                                                 std::uint64_t bytes_per_microbatch_stage);

// PyTorch's CSV: one row per rank, its actions' texts separated by commas. from_csv takes
// the stages' placement from where their actions appear and the counts from the largest
// stage and microbatch seen; it throws Error(invalid_argument) naming the row and cell for
// anything it cannot read. The result is validated by the caller.
std::string to_csv(const Schedule& schedule);
Schedule from_csv(std::string_view text, std::string name = "csv");

}  // namespace braid::parallel
