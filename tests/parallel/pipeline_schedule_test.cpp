// Pipeline schedules (pipeline_schedule.hpp): PyTorch's action text, the generators' orders
// and peak activations, lower()'s transfers, validate()'s refusals and the CSV form.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/parallel/pipeline_schedule.hpp>

#include "../support/expect_error.hpp"

namespace braid::parallel {
namespace {

using braid::testing::expect_invalid_argument;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<Action> parse_list(std::string_view text) {
  std::vector<Action> actions;
  while (!text.empty()) {
    const std::size_t space = text.find(' ');
    actions.push_back(parse_action(text.substr(0, space)));
    if (space == std::string_view::npos) break;
    text.remove_prefix(space + 1);
  }
  return actions;
}

std::string text_of(const std::vector<Action>& actions) {
  std::string out;
  for (const Action& action : actions) out += (out.empty() ? "" : " ") + to_string(action);
  return out;
}

// Every (generator, ranks, microbatches, virtual stages) the sweeps below run.
struct Shape {
  std::string name;
  int ranks;
  int microbatches;
  int virtual_stages;
};
std::vector<Shape> every_shape() {
  std::vector<Shape> shapes;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      for (const char* name : {"gpipe", "1f1b", "zb"}) shapes.push_back({name, p, m, 1});
      if (m % p != 0) continue;
      for (int v = 2; v <= 4; ++v) shapes.push_back({"interleaved", p, m, v});
    }
  }
  return shapes;
}

std::string describe(const Shape& shape) {
  return shape.name + " p=" + std::to_string(shape.ranks) +
         " m=" + std::to_string(shape.microbatches) + " v=" + std::to_string(shape.virtual_stages);
}

// The mean over ranks of the idle share of the step when every compute action takes
// `cost` of its kind and transfers are free: each action starts when its rank is free
// and its input (the neighbouring stage's F, or B or I) has ended.
double unit_bubble(const Schedule& compute, std::map<ActionKind, double> cost) {
  std::map<std::tuple<int, bool, int>, double> ended;  // (stage, gradient, microbatch)
  std::vector<double> free_at(compute.ranks, 0);
  std::vector<double> busy(compute.ranks, 0);
  std::vector<std::size_t> next(compute.ranks, 0);
  bool moved = true;
  while (moved) {
    moved = false;
    for (int rank = 0; rank < compute.ranks; ++rank) {
      const auto& list = compute.actions[rank];
      while (next[rank] < list.size()) {
        const Action& a = list[next[rank]];
        double start = free_at[rank];
        const bool gradient =
            a.kind == ActionKind::backward || a.kind == ActionKind::backward_input;
        if (a.kind == ActionKind::forward && a.stage > 0) {
          const auto input = ended.find({a.stage - 1, false, a.microbatch});
          if (input == ended.end()) break;
          start = std::max(start, input->second);
        }
        if (gradient && a.stage + 1 < compute.stages) {
          const auto input = ended.find({a.stage + 1, true, a.microbatch});
          if (input == ended.end()) break;
          start = std::max(start, input->second);
        }
        free_at[rank] = start + cost.at(a.kind);
        busy[rank] += cost.at(a.kind);
        if (a.kind == ActionKind::forward || gradient) {
          ended[{a.stage, gradient, a.microbatch}] = free_at[rank];
        }
        ++next[rank];
        moved = true;
      }
    }
  }
  const double step = *std::max_element(free_at.begin(), free_at.end());
  double idle = 0;
  for (double b : busy) idle += (step - b) / step;
  return idle / compute.ranks;
}

const std::map<ActionKind, double> kUnitCosts = {{ActionKind::forward, 1},
                                                 {ActionKind::backward, 2},
                                                 {ActionKind::backward_input, 1},
                                                 {ActionKind::backward_weight, 1}};

// ---- the text form

TEST(PipelineActionText, ReadsAndWritesPyTorchsForm) {
  EXPECT_EQ(parse_action("0F1"), (Action{0, ActionKind::forward, 1}));
  EXPECT_EQ(parse_action("1B0"), (Action{1, ActionKind::backward, 0}));
  EXPECT_EQ(parse_action("2I3"), (Action{2, ActionKind::backward_input, 3}));
  EXPECT_EQ(parse_action("2W3"), (Action{2, ActionKind::backward_weight, 3}));
  EXPECT_EQ(parse_action("0SEND_F1"), (Action{0, ActionKind::send_forward, 1}));
  EXPECT_EQ(parse_action("0RECV_F1"), (Action{0, ActionKind::recv_forward, 1}));
  EXPECT_EQ(parse_action("0SEND_B1"), (Action{0, ActionKind::send_backward, 1}));
  EXPECT_EQ(parse_action("1RECV_B2"), (Action{1, ActionKind::recv_backward, 2}));
  EXPECT_EQ(parse_action("3REDUCE_GRAD"), (Action{3, ActionKind::reduce_grad, -1}));
  EXPECT_EQ(parse_action(" 12F345 "), (Action{12, ActionKind::forward, 345}));
}

TEST(PipelineActionText, EveryKindRoundTrips) {
  for (const char* text : {"0F1", "1B0", "2I3", "2W3", "0SEND_F1", "4RECV_F1", "0SEND_B1",
                           "1RECV_B2", "3REDUCE_GRAD", "10F11"}) {
    EXPECT_EQ(to_string(parse_action(text)), text);
  }
}

TEST(PipelineActionText, KindsSayWhetherTheyComputeOrCommunicate) {
  EXPECT_EQ(to_string(ActionKind::recv_backward), "RECV_B");
  EXPECT_TRUE(is_compute(ActionKind::backward_weight));
  EXPECT_FALSE(is_compute(ActionKind::send_forward));
  EXPECT_TRUE(is_communication(ActionKind::recv_forward));
  EXPECT_FALSE(is_communication(ActionKind::reduce_grad));
  EXPECT_FALSE(is_compute(ActionKind::reduce_grad));
}

TEST(PipelineActionText, RefusesAnythingElseNamingTheText) {
  for (const char* text : {"", "F1", "0X1", "0F", "0F1x", "-1F0", "0SEND_X1", "0REDUCE_GRAD1",
                           "0f1", "1234567890F0"}) {
    expect_invalid_argument([&] { parse_action(text); },
                            std::string("'") + text + "' is not a pipeline action");
  }
}

// ---- the generators

TEST(PipelineGenerators, EveryScheduleLowersAndValidatesForManyShapes) {
  for (const Shape& shape : every_shape()) {
    SCOPED_TRACE(describe(shape));
    const Schedule compute =
        make_schedule(shape.name, shape.ranks, shape.microbatches, shape.virtual_stages);
    EXPECT_FALSE(compute.lowered());
    EXPECT_NO_THROW(validate(compute));
    EXPECT_NO_THROW(validate(lower(compute)));
    EXPECT_NO_THROW(validate(lower(compute, {.reduce_grad = true})));
  }
}

TEST(PipelineGenerators, EveryStageForwardsAndBackwardsEachMicrobatchOnceOnItsRank) {
  for (const Shape& shape : every_shape()) {
    SCOPED_TRACE(describe(shape));
    const Schedule s =
        make_schedule(shape.name, shape.ranks, shape.microbatches, shape.virtual_stages);
    ASSERT_EQ(s.stages, shape.ranks * shape.virtual_stages);
    std::map<std::pair<int, int>, std::string> seen;  // (stage, microbatch) -> kinds
    for (int rank = 0; rank < s.ranks; ++rank) {
      for (const Action& a : s.actions[rank]) {
        EXPECT_EQ(s.stage_rank[a.stage], rank);
        EXPECT_EQ(a.stage % s.ranks, rank);
        seen[{a.stage, a.microbatch}] += to_string(a.kind);
      }
    }
    ASSERT_EQ(seen.size(), static_cast<std::size_t>(s.stages * s.microbatches));
    for (const auto& [key, kinds] : seen) {
      EXPECT_EQ(kinds, shape.name == "zb" ? "FIW" : "FB") << key.first << " " << key.second;
    }
  }
}

TEST(PipelineGenerators, GPipeForwardsEveryMicrobatchThenBackwardsThem) {
  const Schedule s = gpipe(2, 3);
  EXPECT_EQ(s.name, "GPipe");
  EXPECT_EQ(text_of(s.actions[0]), "0F0 0F1 0F2 0B0 0B1 0B2");
  EXPECT_EQ(text_of(s.actions[1]), "1F0 1F1 1F2 1B0 1B1 1B2");
  EXPECT_THAT(peak_in_flight(s), ElementsAre(3, 3));
}

TEST(PipelineGenerators, OneFOneBWarmsUpAlternatesAndDrains) {
  const Schedule s = one_f_one_b(3, 4);
  EXPECT_EQ(s.name, "1F1B");
  EXPECT_EQ(text_of(s.actions[0]), "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3");
  EXPECT_EQ(text_of(s.actions[1]), "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3");
  EXPECT_EQ(text_of(s.actions[2]), "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3");
  // Fewer microbatches than warm-up forwards: all of them, then all backwards.
  EXPECT_EQ(text_of(one_f_one_b(4, 2).actions[0]), "0F0 0F1 0B0 0B1");
}

// ZB-H1 holds what 1F1B holds at its peak, rank 0's min(p, m), on every rank: the later
// ranks defer their Ws up to that bound (Qi et al., figure 3), where 1F1B's hold p - r.
TEST(PipelineGenerators, PeakInFlightIsRanksLessRankFor1F1BMicrobatchesForGPipe) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      std::vector<int> one_f_one_b_peaks;
      for (int r = 0; r < p; ++r) one_f_one_b_peaks.push_back(std::min(p - r, m));
      EXPECT_EQ(peak_in_flight(one_f_one_b(p, m)), one_f_one_b_peaks);
      EXPECT_EQ(peak_in_flight(lower(one_f_one_b(p, m))), one_f_one_b_peaks);
      EXPECT_EQ(peak_in_flight(gpipe(p, m)), std::vector<int>(p, m));
      const std::vector<int> zb = peak_in_flight(zero_bubble_h1(p, m));
      EXPECT_EQ(*std::max_element(zb.begin(), zb.end()), std::min(p, m));
      EXPECT_EQ(zb[0], one_f_one_b_peaks[0]);
      for (int r = 0; r < p; ++r) EXPECT_GE(zb[r], one_f_one_b_peaks[r]);
    }
  }
}

TEST(PipelineGenerators, PeakActivationBytesArePeakInFlightTimesTheBytesOfOne) {
  EXPECT_THAT(peak_activation_bytes(one_f_one_b(3, 8), 1000), ElementsAre(3000, 2000, 1000));
}

TEST(PipelineGenerators, InterleavedRunsGroupsOfRanksMicrobatchesThroughTheChunksAsMegatron) {
  const Schedule s = interleaved_one_f_one_b(2, 4, 2);
  EXPECT_EQ(s.name, "Interleaved1F1B");
  EXPECT_EQ(s.stages, 4);
  EXPECT_THAT(s.stage_rank, ElementsAre(0, 1, 0, 1));
  EXPECT_THAT(s.stages_of(1), ElementsAre(1, 3));
  // Rank 0: (2 - 0 - 1) 2 + (2 - 1) 2 = 4 warm-up forwards; backward chunks descend.
  EXPECT_EQ(text_of(s.actions[0]),
            "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
  // Rank 1: 2 warm-up forwards.
  EXPECT_EQ(text_of(s.actions[1]),
            "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3");
}

TEST(PipelineGenerators, ZeroBubbleKeeps1F1BsOrderOfForwardsAndInputGradients) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      const Schedule zb = zero_bubble_h1(p, m);
      const Schedule reference = one_f_one_b(p, m);
      for (int r = 0; r < p; ++r) {
        std::vector<Action> forward_and_input;
        for (Action a : zb.actions[r]) {
          if (a.kind == ActionKind::backward_weight) continue;
          if (a.kind == ActionKind::backward_input) a.kind = ActionKind::backward;
          forward_and_input.push_back(a);
        }
        EXPECT_EQ(forward_and_input, reference.actions[r]) << "p=" << p << " m=" << m << " r=" << r;
      }
    }
  }
}

TEST(PipelineGenerators, ZeroBubbleLastRankDefersItsWeightGradientsUpToRanksInFlight) {
  const Schedule s = zero_bubble_h1(4, 6);
  EXPECT_EQ(s.name, "ZBH1");
  EXPECT_EQ(text_of(s.actions[3]),
            "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3W3 3W4 3W5");
}

// With F = I = W = 1 (B = 2) each rank computes 3m; 1F1B idles 3(p-1) of its step,
// ZB-H1 p-1 (F + B - W per warm-up slot, Qi et al.): a third.
TEST(PipelineGenerators, ZeroBubbleIdlesAThirdOf1F1BsTimeInUnitCosts) {
  for (auto [p, m] : {std::pair{2, 4}, {4, 8}, {4, 16}, {8, 16}, {8, 32}}) {
    SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
    const double textbook = static_cast<double>(p - 1) / (m + p - 1);
    EXPECT_NEAR(unit_bubble(one_f_one_b(p, m), kUnitCosts), textbook, 1e-9);
    EXPECT_NEAR(unit_bubble(gpipe(p, m), kUnitCosts), textbook, 1e-9);
    EXPECT_NEAR(unit_bubble(zero_bubble_h1(p, m), kUnitCosts),
                static_cast<double>(p - 1) / (3 * m + p - 1), 1e-9);
  }
}

TEST(PipelineGenerators, InterleavedUnitBubbleShrinksByTheVirtualStages) {
  const int p = 4, m = 8;
  for (int v = 2; v <= 4; ++v) {
    // Each virtual stage costs 1/v of a whole rank's stage.
    std::map<ActionKind, double> costs = kUnitCosts;
    for (auto& [kind, cost] : costs) cost /= v;
    const double bubble = unit_bubble(interleaved_one_f_one_b(p, m, v), costs);
    EXPECT_NEAR(bubble, static_cast<double>(p - 1) / (v * m + p - 1), 1e-9) << "v=" << v;
  }
}

TEST(PipelineGenerators, RefuseWhatTheScheduleCannotTake) {
  expect_invalid_argument([] { gpipe(0, 4); }, "GPipe needs at least one rank, not 0");
  expect_invalid_argument([] { one_f_one_b(2, 0); }, "1F1B needs at least one microbatch, not 0");
  expect_invalid_argument([] { zero_bubble_h1(-1, 2); }, "ZBH1 needs at least one rank");
  expect_invalid_argument([] { interleaved_one_f_one_b(2, 4, 1); },
                          "needs at least 2 virtual stages per rank, not 1");
  expect_invalid_argument([] { interleaved_one_f_one_b(4, 6, 2); },
                          "multiple of the ranks, as Megatron-Core does: 6 microbatches over 4");
}

TEST(PipelineGenerators, MakeScheduleTakesTheToolsNames) {
  EXPECT_EQ(make_schedule("gpipe", 2, 2).name, "GPipe");
  EXPECT_EQ(make_schedule("1f1b", 2, 2).name, "1F1B");
  EXPECT_EQ(make_schedule("zb", 2, 2).name, "ZBH1");
  EXPECT_EQ(make_schedule("interleaved", 2, 2, 3).stages, 6);
  EXPECT_EQ(make_schedule("1F1B", 2, 2).name, "1F1B");
  expect_invalid_argument([] { make_schedule("pipedream", 2, 2); },
                          "no pipeline schedule 'pipedream' (the schedules are gpipe, 1f1b, "
                          "interleaved and zb)");
  expect_invalid_argument([] { make_schedule("1f1b", 2, 2, 2); },
                          "the 1f1b schedule runs one stage per rank, not 2");
  expect_invalid_argument([] { make_schedule("interleaved", 2, 2); }, "at least 2 virtual stages");
}

// ---- lower()

TEST(PipelineLower, SendsRightAfterTheProducerAndReceivesRightBeforeTheConsumer) {
  const Schedule s = lower(one_f_one_b(2, 2));
  EXPECT_TRUE(s.lowered());
  EXPECT_EQ(text_of(s.actions[0]), "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1");
  EXPECT_EQ(text_of(s.actions[1]), "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1");
}

TEST(PipelineLower, ZeroBubbleSendsTheGradientAfterIAndReducesAfterTheLastW) {
  const Schedule s = lower(zero_bubble_h1(2, 2), {.reduce_grad = true});
  EXPECT_EQ(text_of(s.actions[0]),
            "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0I0 0W0 0RECV_B1 0I1 0W1 0REDUCE_GRAD");
  EXPECT_EQ(text_of(s.actions[1]),
            "1RECV_F0 1F0 1I0 1SEND_B0 1RECV_F1 1F1 1I1 1SEND_B1 1W0 1W1 1REDUCE_GRAD");
}

TEST(PipelineLower, ReducesEachStageOnceAfterItsLastBackward) {
  const Schedule s = lower(interleaved_one_f_one_b(2, 2, 2), {.reduce_grad = true});
  for (int rank = 0; rank < 2; ++rank) {
    const auto& list = s.actions[rank];
    for (int stage : s.stages_of(rank)) {
      const Action reduce{.stage = stage, .kind = ActionKind::reduce_grad};
      ASSERT_EQ(std::count(list.begin(), list.end(), reduce), 1);
      const auto at = std::find(list.begin(), list.end(), reduce);
      // Right after its last B, or its SEND_B.
      EXPECT_TRUE(std::none_of(at, list.end(), [&](const Action& a) {
        return a.stage == stage && a.kind == ActionKind::backward;
      }));
      const Action before = *(at - 1);
      EXPECT_EQ(before.stage, stage);
      EXPECT_TRUE(before.kind == ActionKind::backward || before.kind == ActionKind::send_backward);
    }
  }
  EXPECT_FALSE(lower(one_f_one_b(2, 2)).actions[0].back().kind == ActionKind::reduce_grad);
}

TEST(PipelineLower, AddsNoTransferBetweenStagesOnOneRank) {
  const Schedule compute = interleaved_one_f_one_b(1, 3, 3);
  EXPECT_THAT(compute.stage_rank, ElementsAre(0, 0, 0));
  const Schedule s = lower(compute);
  EXPECT_FALSE(s.lowered());
  EXPECT_EQ(s.actions, compute.actions);
  EXPECT_NO_THROW(validate(s));
  for (const Shape& shape : every_shape()) {
    const Schedule lowered =
        lower(make_schedule(shape.name, shape.ranks, shape.microbatches, shape.virtual_stages));
    for (int rank = 0; rank < lowered.ranks; ++rank) {
      for (const Action& a : lowered.actions[rank]) {
        if (!is_communication(a.kind)) continue;
        const bool to_next =
            a.kind == ActionKind::send_forward || a.kind == ActionKind::recv_backward;
        EXPECT_NE(lowered.stage_rank[a.stage + (to_next ? 1 : -1)], rank) << describe(shape);
      }
    }
  }
}

TEST(PipelineLower, RefusesAComputeScheduleThatCannotRunNamingWhatEachRankWaitsFor) {
  Schedule s = interleaved_one_f_one_b(2, 2, 2);
  s.actions[0] = parse_list("0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1");
  s.actions[1] = parse_list("3F0 3F1 1F0 1F1 3B0 3B1 1B0 1B1");
  expect_invalid_argument([&] { lower(s); }, "the compute schedule cannot run");
  expect_invalid_argument([&] { lower(s); }, "rank 0 position 2: 2F0 waits for 1F0");
  expect_invalid_argument([&] { lower(s); }, "rank 1 position 0: 3F0 waits for 2F0");
  expect_invalid_argument([&] { lower(s); }, ">3F0<");
  // The compute schedule alone deadlocks just the same.
  expect_invalid_argument([&] { validate(s); }, "deadlocks");
}

TEST(PipelineLower, TakesComputeSchedulesOnly) {
  expect_invalid_argument([] { lower(lower(one_f_one_b(2, 2))); },
                          "rank 0 position 1: 0SEND_F0: lower() takes a compute schedule");
  Schedule broken = one_f_one_b(2, 2);
  broken.actions[1].pop_back();
  expect_invalid_argument([&] { lower(broken); }, "1B1 is missing");
}

// ---- validate()

Schedule lowered_1f1b(int ranks, int microbatches) {
  return lower(one_f_one_b(ranks, microbatches));
}

TEST(PipelineValidate, RefusesABackwardBeforeItsForward) {
  Schedule s = lowered_1f1b(2, 2);
  std::swap(s.actions[1][1], s.actions[1][2]);  // 1RECV_F0 1B0 1F0 ...
  expect_invalid_argument([&] { validate(s); }, "rank 1 position 1: 1B0 before 1F0");
  expect_invalid_argument([&] { validate(s); }, ">1B0<");
}

TEST(PipelineValidate, RefusesAWeightGradientBeforeItsInputGradient) {
  Schedule s = zero_bubble_h1(2, 2);
  s.actions[1] = parse_list("1F0 1W0 1I0 1F1 1I1 1W1");
  expect_invalid_argument([&] { validate(s); }, "rank 1 position 1: 1W0 before 1I0");
}

TEST(PipelineValidate, RefusesAMissingMicrobatch) {
  Schedule s = one_f_one_b(2, 3);
  s.actions[0] = parse_list("0F0 0F2 0B0 0B2");
  expect_invalid_argument([&] { validate(s); }, "0F1 is missing");
  s.actions[0] = parse_list("0F0 0F1 0F2 0B0 0B2");
  expect_invalid_argument([&] { validate(s); }, "0B1 is missing");
  Schedule zb = zero_bubble_h1(1, 2);
  zb.actions[0] = parse_list("0F0 0I0 0F1 0I1 0W1");
  expect_invalid_argument([&] { validate(zb); }, "0W0 is missing");
}

TEST(PipelineValidate, RefusesAnActionTwiceOrBothBackwardForms) {
  Schedule s = one_f_one_b(1, 2);
  s.actions[0] = parse_list("0F0 0B0 0F1 0B1 0F1");
  expect_invalid_argument([&] { validate(s); },
                          "rank 0 position 4: 0F1: a second time (first at position 2)");
  s.actions[0] = parse_list("0F0 0B0 0I0 0F1 0B1");
  expect_invalid_argument([&] { validate(s); },
                          "rank 0 position 2: 0I0: stage 0 microbatch 0 "
                          "already has a backward of the other form");
}

TEST(PipelineValidate, RefusesAStageOnTwoRanksOrOnNone) {
  Schedule s = one_f_one_b(2, 1);
  s.actions[1].push_back(parse_action("0W0"));
  expect_invalid_argument([&] { validate(s); },
                          "rank 1 position 2: 0W0: stage 0 runs on rank 0, and a stage runs on one "
                          "rank");
  const Schedule from_two_rows = from_csv("0F0,1F0,1B0\n1B0,0B0\n");
  expect_invalid_argument([&] { validate(from_two_rows); },
                          "rank 1 position 0: 1B0: stage 1 runs on rank 0");
  const Schedule gap = from_csv("0F0,0B0\n2F0,2B0\n");
  EXPECT_THAT(gap.stage_rank, ElementsAre(0, -1, 1));
  expect_invalid_argument([&] { validate(gap); }, "stage 1 is on no rank");
}

TEST(PipelineValidate, RefusesOutOfRangeStagesAndMicrobatches) {
  Schedule s = one_f_one_b(2, 1);
  s.actions[0].push_back(parse_action("0F7"));
  expect_invalid_argument([&] { validate(s); },
                          "rank 0 position 2: 0F7: no microbatch 7 (the microbatches are 0..0)");
  s = one_f_one_b(2, 1);
  s.actions[1].push_back(parse_action("5F0"));
  expect_invalid_argument([&] { validate(s); }, "rank 1 position 2: 5F0: no stage 5");
}

TEST(PipelineValidate, RefusesACycleAcrossRanks) {
  // Rank 0 waits for 1's gradient before sending 1 the activation that gradient needs.
  Schedule s = lowered_1f1b(2, 1);
  s.actions[0] = parse_list("0F0 0RECV_B0 0SEND_F0 0B0");
  EXPECT_EQ(text_of(s.actions[1]), "1RECV_F0 1F0 1B0 1SEND_B0");
  expect_invalid_argument([&] { validate(s); },
                          "rank 0 position 1: 0RECV_B0 waits on itself through other ranks");
  expect_invalid_argument([&] { validate(s); },
                          "stuck: rank 0 position 1: 0RECV_B0, rank 1 "
                          "position 0: 1RECV_F0");
  expect_invalid_argument([&] { validate(s); }, ">0RECV_B0<");
}

TEST(PipelineValidate, RefusesAReceiveWithoutASendAndASendWithoutAReceive) {
  Schedule s = lowered_1f1b(2, 1);
  s.actions[0] = parse_list("0F0 0RECV_B0 0B0");
  expect_invalid_argument([&] { validate(s); },
                          "rank 1 position 0: 1RECV_F0 has no 0SEND_F0 on rank 0 (a receive with "
                          "no matching send)");
  s = lowered_1f1b(2, 1);
  s.actions[1] = parse_list("1F0 1B0 1SEND_B0");
  expect_invalid_argument([&] { validate(s); },
                          "rank 0 position 1: 0SEND_F0 has no 1RECV_F0 on rank 1 (a send with no "
                          "receive)");
}

TEST(PipelineValidate, RefusesAnInputFromAnotherRankThatIsNotReceived) {
  Schedule s = lowered_1f1b(2, 1);
  s.actions[0] = parse_list("0F0 0RECV_B0 0B0");
  s.actions[1] = parse_list("1F0 1B0 1SEND_B0");
  expect_invalid_argument([&] { validate(s); },
                          "rank 1 position 0: 1F0 has no 1RECV_F0 before it: its input comes "
                          "from rank 0");
}

TEST(PipelineValidate, RefusesTransfersOutOfPlace) {
  Schedule s = lowered_1f1b(2, 1);
  s.actions[1] = parse_list("1F0 1RECV_F0 1B0 1SEND_B0");
  expect_invalid_argument([&] { validate(s); },
                          "rank 1 position 1: 1RECV_F0 after 1F0, which needs it");
  s = lowered_1f1b(2, 1);
  s.actions[0] = parse_list("0SEND_F0 0F0 0RECV_B0 0B0");
  expect_invalid_argument([&] { validate(s); },
                          "rank 0 position 0: 0SEND_F0 before 0F0, whose result it sends");
  s = lowered_1f1b(2, 1);
  s.actions[1].push_back(parse_action("1SEND_F0"));
  expect_invalid_argument([&] { validate(s); }, "1SEND_F0 has no other end: stage 1 has no next");
  s = lowered_1f1b(2, 1);
  s.actions[1].push_back(parse_action("1SEND_B0"));
  expect_invalid_argument([&] { validate(s); }, "rank 1 position 4: 1SEND_B0 a second time");
  s = lower(interleaved_one_f_one_b(1, 1, 2));
  s.actions[0].push_back(parse_action("0SEND_F0"));
  expect_invalid_argument([&] { validate(s); }, "between stages 0 and 1, which both run on rank 0");
}

TEST(PipelineValidate, RefusesAGradientReductionBeforeTheStagesLastBackward) {
  Schedule s = one_f_one_b(1, 2);
  s.actions[0] = parse_list("0F0 0B0 0REDUCE_GRAD 0F1 0B1");
  expect_invalid_argument([&] { validate(s); },
                          "rank 0 position 2: 0REDUCE_GRAD before 0B1 (position 4)");
  s.actions[0] = parse_list("0F0 0B0 0F1 0B1 0REDUCE_GRAD 0REDUCE_GRAD");
  expect_invalid_argument([&] { validate(s); }, "rank 0 position 5: 0REDUCE_GRAD a second time");
}

TEST(PipelineValidate, RefusesAScheduleOfTheWrongShape) {
  Schedule s = one_f_one_b(2, 1);
  s.ranks = 3;
  expect_invalid_argument([&] { validate(s); }, "3 ranks but 2 action lists");
  s = one_f_one_b(2, 1);
  s.stage_rank = {0};
  expect_invalid_argument([&] { validate(s); }, "2 stages but stage_rank places 1");
  s = one_f_one_b(2, 1);
  s.microbatches = 0;
  expect_invalid_argument([&] { validate(s); }, "0 microbatches");
}

// ---- the grid

TEST(PipelineGrid, PrintsOneRowPerRankWithTheMarkedCellsStandingOut) {
  const Schedule s = lowered_1f1b(2, 1);
  EXPECT_EQ(grid_text(s, {{1, 2}}),
            "        0          1          2          3\n"
            "rank 0  0F0        0SEND_F0   0RECV_B0   0B0\n"
            "rank 1  1RECV_F0   1F0       >1B0<       1SEND_B0\n");
  EXPECT_EQ(grid_text(one_f_one_b(2, 1)),
            "        0     1\n"
            "rank 0  0F0   0B0\n"
            "rank 1  1F0   1B0\n");
  EXPECT_EQ(grid_text(s, {}, true),
            "rank 0  0F0   0B0\n"
            "rank 1  1F0   1B0\n");
}

// ---- CSV

TEST(PipelineCsv, WritesOneRowPerRankAsPyTorchDoes) {
  EXPECT_EQ(to_csv(lowered_1f1b(2, 1)), "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
}

TEST(PipelineCsv, EveryScheduleRoundTrips) {
  for (const Shape& shape : every_shape()) {
    if (shape.ranks > 4 || shape.microbatches > 8) continue;
    SCOPED_TRACE(describe(shape));
    for (bool reduce_grad : {false, true}) {
      const Schedule s =
          lower(make_schedule(shape.name, shape.ranks, shape.microbatches, shape.virtual_stages),
                {.reduce_grad = reduce_grad});
      const Schedule back = from_csv(to_csv(s), "back");
      EXPECT_EQ(back.name, "back");
      EXPECT_EQ(back.ranks, s.ranks);
      EXPECT_EQ(back.stages, s.stages);
      EXPECT_EQ(back.microbatches, s.microbatches);
      EXPECT_EQ(back.stage_rank, s.stage_rank);
      EXPECT_EQ(back.actions, s.actions);
      EXPECT_NO_THROW(validate(back));
    }
  }
}

TEST(PipelineCsv, ReadsWhatPythonsCsvWritesWithIdleCellsAndBlanks) {
  const Schedule s = from_csv("0F0, 0F1,,0B0,0B1,\r\n,1F0,1B0,1F1,1B1\r\n");
  EXPECT_EQ(s.name, "csv");
  EXPECT_EQ(s.ranks, 2);
  EXPECT_EQ(s.stages, 2);
  EXPECT_EQ(s.microbatches, 2);
  EXPECT_EQ(text_of(s.actions[0]), "0F0 0F1 0B0 0B1");
  EXPECT_EQ(text_of(s.actions[1]), "1F0 1B0 1F1 1B1");
  EXPECT_NO_THROW(validate(s));
  // A last row without its line end, and an empty row: a rank with nothing to run.
  EXPECT_EQ(from_csv("0F0,0B0\n\n1F0,1B0").ranks, 3);
}

TEST(PipelineCsv, RefusesWhatItCannotReadNamingTheRowAndCell) {
  expect_invalid_argument([] { from_csv("0F0,0B0\n1F0,1X0\n"); },
                          "CSV row 1 cell 1: '1X0' is not a pipeline action");
  expect_invalid_argument([] { from_csv(""); }, "the CSV holds no pipeline action");
  expect_invalid_argument([] { from_csv(",\n\n"); }, "the CSV holds no pipeline action");
}

}  // namespace
}  // namespace braid::parallel
