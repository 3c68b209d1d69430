// The pipeline simulator (pipeline_simulator.hpp): exact times on small hand-built
// schedules, transfers in both forms, and the textbook bubbles of the generated schedules.
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/parallel/pipeline_schedule.hpp>
#include <braid/parallel/pipeline_simulator.hpp>

#include "../support/expect_error.hpp"

namespace braid::parallel {
namespace {

using braid::testing::expect_invalid_argument;
using ::testing::DoubleNear;
using ::testing::Each;
using ::testing::ElementsAre;

constexpr ActionKind F = ActionKind::forward;
constexpr ActionKind B = ActionKind::backward;
constexpr ActionKind I = ActionKind::backward_input;
constexpr ActionKind W = ActionKind::backward_weight;

// A schedule with stage s on rank s (one stage per rank), its lists given.
Schedule by_hand(int microbatches, std::vector<std::vector<Action>> actions) {
  Schedule schedule;
  schedule.name = "by hand";
  schedule.ranks = static_cast<int>(actions.size());
  schedule.stages = schedule.ranks;
  schedule.microbatches = microbatches;
  for (int s = 0; s < schedule.stages; ++s) schedule.stage_rank.push_back(s);
  schedule.actions = std::move(actions);
  return schedule;
}

// GPipe written out: every forward, then every backward.
Schedule gpipe_by_hand(int ranks, int microbatches) {
  std::vector<std::vector<Action>> actions(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    for (int mb = 0; mb < microbatches; ++mb) actions[r].push_back({r, F, mb});
    for (int mb = 0; mb < microbatches; ++mb) actions[r].push_back({r, B, mb});
  }
  return by_hand(microbatches, std::move(actions));
}

// Each action's (begin, end), in the order of result.actions.
std::vector<std::pair<double, double>> times(const SimulationResult& result) {
  std::vector<std::pair<double, double>> out;
  for (const auto& a : result.actions) out.emplace_back(a.begin, a.end);
  return out;
}

TEST(PipelineSimulator, TwoStageGPipeWithUnitCostsRunsAsDrawnInTheTextbook) {
  const SimulationResult result = simulate(gpipe_by_hand(2, 2));
  // Rank 0: F0 F1, then waits for rank 1's B0 (which needs both forwards there).
  // Rank 1: F0 after rank 0's, F1, B0, B1.
  EXPECT_THAT(times(result),
              ElementsAre(std::pair{0.0, 1.0}, std::pair{1.0, 2.0}, std::pair{5.0, 7.0},
                          std::pair{7.0, 9.0}, std::pair{1.0, 2.0}, std::pair{2.0, 3.0},
                          std::pair{3.0, 5.0}, std::pair{5.0, 7.0}));
  EXPECT_EQ(result.step_time, 9);
  EXPECT_THAT(result.busy, ElementsAre(6, 6));
  EXPECT_THAT(result.bubble_percent, Each(DoubleNear(100.0 / 3, 1e-9)));
  EXPECT_EQ(result.actions[2].rank, 0);
  EXPECT_EQ(result.actions[2].action, (Action{0, B, 0}));
  EXPECT_EQ(result.actions[4].rank, 1);
}

// With unit costs every rank of GPipe idles (p-1)(F+B) of a step of (m+p-1)(F+B): the
// textbook bubble holds for each rank, not only on average.
TEST(PipelineSimulator, GPipeBubbleIsTheTextbookOneOnEveryRank) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 5, 8, 16}) {
      const SimulationResult result = simulate(gpipe_by_hand(p, m));
      EXPECT_DOUBLE_EQ(result.step_time, 3.0 * (m + p - 1)) << "p=" << p << " m=" << m;
      for (double bubble : result.bubble_percent)
        EXPECT_NEAR(bubble, textbook_bubble_percent(p, m), 1e-9) << "p=" << p << " m=" << m;
      EXPECT_NEAR(result.mean_bubble_percent(), textbook_bubble_percent(p, m), 1e-9);
      EXPECT_THAT(result.peak_in_flight, Each(m));
    }
  }
}

TEST(PipelineSimulator, ComputeScheduleTransfersTakeLatencyPlusBytesOverBandwidth) {
  const SimulationCosts costs{.p2p_latency = 0.25, .p2p_bytes = 50, .p2p_bytes_per_unit = 200};
  const SimulationResult result = simulate(gpipe_by_hand(2, 1), costs);
  // F on rank 0 [0,1]; the activation lands at 1.5; rank 1's F [1.5,2.5], B [2.5,4.5];
  // the gradient lands at 5; rank 0's B [5,7].
  EXPECT_THAT(times(result), ElementsAre(std::pair{0.0, 1.0}, std::pair{5.0, 7.0},
                                         std::pair{1.5, 2.5}, std::pair{2.5, 4.5}));
  EXPECT_EQ(result.step_time, 7);
  EXPECT_NEAR(result.bubble_percent[0], 100.0 * 4 / 7, 1e-9);
}

TEST(PipelineSimulator, ZeroBandwidthMeansTransfersTakeOnlyTheLatency) {
  const SimulationCosts costs{.p2p_latency = 0.5, .p2p_bytes = 1e9};
  EXPECT_EQ(simulate(gpipe_by_hand(2, 1), costs).step_time, 3 + 3 + 2 * 0.5);
}

// 0F0 0SEND_F0 0RECV_B0 0B0 | 1RECV_F0 1F0 1B0 1SEND_B0: the receive blocks its rank
// until the send's data lands; the send itself takes no rank time.
Schedule lowered_two_stages() {
  return by_hand(
      1,
      {{{0, F, 0}, {0, ActionKind::send_forward, 0}, {0, ActionKind::recv_backward, 0}, {0, B, 0}},
       {{1, ActionKind::recv_forward, 0},
        {1, F, 0},
        {1, B, 0},
        {1, ActionKind::send_backward, 0}}});
}

TEST(PipelineSimulator, LoweredReceiveWaitsForItsSendPlusTheTransfer) {
  const SimulationCosts costs{.p2p_latency = 0.5, .p2p_bytes = 100, .p2p_bytes_per_unit = 100};
  const SimulationResult result = simulate(lowered_two_stages(), costs);
  EXPECT_THAT(times(result), ElementsAre(std::pair{0.0, 1.0},   // 0F0
                                         std::pair{1.0, 1.0},   // 0SEND_F0: background
                                         std::pair{1.0, 7.0},   // 0RECV_B0: until 1SEND_B0 + 1.5
                                         std::pair{7.0, 9.0},   // 0B0
                                         std::pair{0.0, 2.5},   // 1RECV_F0: 0SEND_F0 + 1.5
                                         std::pair{2.5, 3.5},   // 1F0
                                         std::pair{3.5, 5.5},   // 1B0
                                         std::pair{5.5, 5.5}))  // 1SEND_B0
  ;
  EXPECT_EQ(result.step_time, 9);
  // Receives are waiting, not compute.
  EXPECT_THAT(result.busy, ElementsAre(3, 3));
  EXPECT_NEAR(result.bubble_percent[0], 100.0 * 6 / 9, 1e-9);
}

TEST(PipelineSimulator, LoweredAndComputeFormsTakeTheSameTimeForTheSameCosts) {
  const SimulationCosts costs{.p2p_latency = 0.5, .p2p_bytes = 100, .p2p_bytes_per_unit = 100};
  EXPECT_EQ(simulate(lowered_two_stages(), costs).step_time,
            simulate(gpipe_by_hand(2, 1), costs).step_time);
}

TEST(PipelineSimulator, ReduceGradTakesItsCostAndIsNotCompute) {
  Schedule schedule = lowered_two_stages();
  schedule.actions[0].push_back({0, ActionKind::reduce_grad, -1});
  schedule.actions[1].push_back({1, ActionKind::reduce_grad, -1});
  const SimulationResult result = simulate(schedule, {.reduce_grad = 4});
  EXPECT_EQ(result.actions[4].begin, 6);  // 0REDUCE_GRAD after 0B0 [4,6]
  EXPECT_EQ(result.actions[4].end, 10);
  EXPECT_EQ(result.actions.back().begin, 4);  // 1REDUCE_GRAD after 1SEND_B0 at 4
  EXPECT_EQ(result.step_time, 10);
  EXPECT_THAT(result.busy, ElementsAre(3, 3));
}

// Split backward: I passes the gradient on at once, W fills time the rank would idle.
TEST(PipelineSimulator, SplitBackwardLetsWeightGradientsFillTheDrain) {
  // Two ranks, two microbatches, 1F1B shape with I then W deferred on rank 0.
  const Schedule split =
      by_hand(2, {{{0, F, 0}, {0, F, 1}, {0, I, 0}, {0, I, 1}, {0, W, 0}, {0, W, 1}},
                  {{1, F, 0}, {1, I, 0}, {1, F, 1}, {1, I, 1}, {1, W, 0}, {1, W, 1}}});
  const SimulationResult result = simulate(split);
  // Rank 1: F0 [1,2] I0 [2,3] F1 [3,4] I1 [4,5] W0 [5,6] W1 [6,7].
  // Rank 0: F0 [0,1] F1 [1,2] I0 [3,4] I1 [5,6] W0 [6,7] W1 [7,8].
  EXPECT_EQ(result.step_time, 8);
  EXPECT_THAT(result.busy, ElementsAre(6, 6));
  // W releases what F held.
  EXPECT_THAT(result.peak_in_flight, ElementsAre(2, 2));
  EXPECT_LT(result.mean_bubble_percent(), textbook_bubble_percent(2, 2));
}

TEST(PipelineSimulator, PeakActivationBytesArePeakTimesTheBytesPerStageAndMicrobatch) {
  const SimulationResult result = simulate(gpipe_by_hand(3, 4), {.activation_bytes = 1000});
  EXPECT_THAT(result.peak_activation_bytes, ElementsAre(4000, 4000, 4000));
}

TEST(PipelineSimulator, NegativeOrNonFiniteCostsAreInvalidArguments) {
  expect_invalid_argument([] { simulate(gpipe_by_hand(2, 1), {.forward = -1}); },
                          "simulation cost forward=-1 is not a finite duration >= 0");
  expect_invalid_argument(
      [] {
        simulate(gpipe_by_hand(2, 1), {.p2p_latency = std::numeric_limits<double>::quiet_NaN()});
      },
      "p2p_latency=nan");
}

TEST(PipelineSimulator, ACycleIsRefusedNotSimulated) {
  // Rank 0 waits for the gradient before sending the activation that would produce it.
  const Schedule cyclic = by_hand(
      1,
      {{{0, F, 0}, {0, ActionKind::recv_backward, 0}, {0, ActionKind::send_forward, 0}, {0, B, 0}},
       {{1, ActionKind::recv_forward, 0},
        {1, F, 0},
        {1, B, 0},
        {1, ActionKind::send_backward, 0}}});
  expect_invalid_argument([&] { simulate(cyclic); }, "0RECV_B0");
}

// The generators' schedules with unit costs, lowered as they run: GPipe, 1F1B and
// interleaved 1F1B (per-chunk costs F 1, B 2) idle exactly the textbook fraction on every
// rank; ZB-H1's split backward idles less than 1F1B.
TEST(PipelineSimulator, GeneratedSchedulesHaveTheTextbookBubbleOnEveryRank) {
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 3 * p}) {
      const std::string where = "p=" + std::to_string(p) + " m=" + std::to_string(m);
      for (const auto& schedule : {gpipe(p, m), one_f_one_b(p, m)}) {
        const SimulationResult result = simulate(lower(schedule));
        EXPECT_DOUBLE_EQ(result.step_time, 3.0 * (m + p - 1)) << schedule.name << " " << where;
        EXPECT_THAT(result.bubble_percent, Each(DoubleNear(textbook_bubble_percent(p, m), 1e-9)))
            << schedule.name << " " << where;
      }
      for (int v : {2, 3}) {
        const SimulationResult result = simulate(lower(interleaved_one_f_one_b(p, m, v)));
        EXPECT_THAT(result.bubble_percent, Each(DoubleNear(textbook_bubble_percent(p, m, v), 1e-9)))
            << "interleaved v=" << v << " " << where;
      }
      const double zero_bubble = simulate(lower(zero_bubble_h1(p, m))).mean_bubble_percent();
      EXPECT_LT(zero_bubble, textbook_bubble_percent(p, m)) << "ZB-H1 " << where;
    }
  }
}

TEST(PipelineSimulator, LoweredSchedulesWaitForTheirTransfersAsTheComputeFormDoes) {
  const SimulationCosts costs{
      .p2p_latency = 0.5, .p2p_bytes = 1 << 20, .p2p_bytes_per_unit = 1 << 21};
  for (const auto& schedule : {gpipe(4, 8), one_f_one_b(4, 8), zero_bubble_h1(4, 8)}) {
    const double compute_form = simulate(schedule, costs).step_time;
    // A receive blocks its rank from where lowering placed it, never less than the compute
    // form waits; each of the 3 hops each way adds one transfer at least.
    EXPECT_GE(simulate(lower(schedule), costs).step_time, compute_form) << schedule.name;
    EXPECT_GE(compute_form, simulate(schedule).step_time + 6 * 1.0) << schedule.name;
  }
}

TEST(PipelineSimulator, PeakInFlightIsTheSchedulesOwn) {
  const Schedule schedule = lower(one_f_one_b(4, 8));
  const SimulationResult result = simulate(schedule, {.activation_bytes = 10});
  EXPECT_THAT(result.peak_in_flight, ElementsAre(4, 3, 2, 1));
  EXPECT_EQ(result.peak_in_flight, peak_in_flight(schedule));
  EXPECT_THAT(result.peak_activation_bytes, ElementsAre(40, 30, 20, 10));
}

TEST(TextbookBubble, IsPMinusOneOverVmPlusPMinusOne) {
  EXPECT_NEAR(textbook_bubble_percent(4, 8), 100.0 * 3 / 11, 1e-12);
  EXPECT_NEAR(textbook_bubble_percent(4, 8, 2), 100.0 * 3 / 19, 1e-12);
  EXPECT_EQ(textbook_bubble_percent(1, 8), 0);
  expect_invalid_argument([] { textbook_bubble_percent(0, 8); }, "ranks=0");
  expect_invalid_argument([] { textbook_bubble_percent(4, 8, 0); }, "virtual_stages=0");
}

TEST(ChromeTrace, IsJsonWithAProcessPerRankAndASpanPerAction) {
  const Schedule schedule = lowered_two_stages();
  const SimulationResult result = simulate(schedule, {.p2p_latency = 0.5});
  const auto trace = nlohmann::json::parse(chrome_trace_json(schedule, result));
  std::vector<std::string> process_names;
  std::vector<std::string> spans;
  for (const auto& event : trace.at("traceEvents")) {
    if (event.at("ph") == "M" && event.at("name") == "process_name")
      process_names.push_back(event.at("args").at("name"));
    if (event.at("ph") != "X") continue;
    spans.push_back(std::to_string(event.at("pid").get<int>()) + ":" +
                    event.at("name").get<std::string>());
    EXPECT_EQ(event.at("cat"), "pipeline");
    EXPECT_GE(event.at("dur").get<double>(), 0);
  }
  EXPECT_THAT(process_names, ElementsAre("rank 0 (by hand)", "rank 1 (by hand)"));
  EXPECT_THAT(spans, ElementsAre("0:0F0", "0:0SEND_F0", "0:0RECV_B0", "0:0B0", "1:1RECV_F0",
                                 "1:1F0", "1:1B0", "1:1SEND_B0"));
  // One unit of cost is one microsecond of the trace.
  const auto& last = trace.at("traceEvents").back();
  EXPECT_EQ(last.at("ts").get<double>(), 4.5);
  EXPECT_EQ(last.at("args").at("stage"), 1);
}

TEST(ChromeTrace, EscapesTheScheduleName) {
  Schedule schedule = gpipe_by_hand(1, 1);
  schedule.name = "a \"quoted\"\\name";
  const auto trace = nlohmann::json::parse(chrome_trace_json(schedule, simulate(schedule)));
  EXPECT_EQ(trace.at("traceEvents").at(0).at("args").at("name"), "rank 0 (a \"quoted\"\\name)");
}

}  // namespace
}  // namespace braid::parallel
