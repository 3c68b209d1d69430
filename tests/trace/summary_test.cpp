// Overlap and exposed communication against hand-built timelines whose answers are known:
// disjoint, nested, partial, several lanes, several ranks; exposed time split into waiting
// for a late rank and transfer; and the latency tables.
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <braid/trace/pipeline_bubble.hpp>
#include <braid/trace/summary.hpp>

namespace braid::trace {
namespace {

TimelineEvent event(std::string category, std::int64_t begin, std::int64_t end,
                    std::string name = "x", std::uint32_t track = 1) {
  TimelineEvent e;
  e.category = std::move(category);
  e.name = std::move(name);
  e.begin_ns = begin;
  e.end_ns = end;
  e.track = track;
  return e;
}

Timeline one_rank(std::vector<TimelineEvent> events) {
  Timeline timeline;
  timeline.world_size = 1;
  timeline.ranks.push_back(RankTimeline{.rank = 0, .events = std::move(events)});
  return timeline;
}

const OverlapFigures& rank0(const Summary& s) {
  return s.ranks.at(0).figures;
}

TEST(Intervals, UnionMergesTouchingAndNestedAndIntersectionKeepsTheCommonParts) {
  EXPECT_EQ(union_of({{5, 8}, {0, 2}, {2, 3}, {6, 7}, {9, 9}}),
            (std::vector<Interval>{{0, 3}, {5, 8}}));
  EXPECT_EQ(intersection_of({{0, 10}, {20, 30}}, {{5, 25}}),
            (std::vector<Interval>{{5, 10}, {20, 25}}));
  EXPECT_EQ(total_length({{0, 3}, {5, 8}}), 6);
}

TEST(Overlap, DisjointComputeAndCommunicationOverlapNothing) {
  const Summary s = summarize(one_rank({event("compute", 0, 100), event("comm", 100, 150)}));
  EXPECT_EQ(rank0(s).compute_ns, 100);
  EXPECT_EQ(rank0(s).communication_ns, 50);
  EXPECT_EQ(rank0(s).overlap_ns, 0);
  EXPECT_EQ(rank0(s).exposed_ns, 50);
  EXPECT_DOUBLE_EQ(*rank0(s).overlap_percent(), 0.0);
  EXPECT_EQ(rank0(s).wall_ns, 150);
}

TEST(Overlap, CommunicationNestedInComputeIsFullyHidden) {
  const Summary s = summarize(one_rank({event("compute", 0, 100), event("comm", 20, 60)}));
  EXPECT_EQ(rank0(s).overlap_ns, 40);
  EXPECT_EQ(rank0(s).exposed_ns, 0);
  EXPECT_DOUBLE_EQ(*rank0(s).overlap_percent(), 100.0);
}

TEST(Overlap, PartialOverlapCountsOnlyTheCommonTime) {
  const Summary s = summarize(one_rank({event("compute", 0, 100), event("comm", 80, 180)}));
  EXPECT_EQ(rank0(s).overlap_ns, 20);
  EXPECT_EQ(rank0(s).exposed_ns, 80);
  EXPECT_DOUBLE_EQ(*rank0(s).overlap_percent(), 20.0);
}

TEST(Overlap, SpansOnSeveralLanesAreUnitedBeforeTheyAreCompared) {
  // Compute on two threads, overlapping each other; two collectives on two communicators,
  // overlapping each other; transport and step spans inside them add nothing.
  const Summary s = summarize(one_rank({
      event("compute", 0, 50, "fwd", 1),
      event("compute", 40, 90, "bwd", 2),
      event("comm", 30, 70, "all_reduce", 3),
      event("comm", 60, 120, "all_gather", 4),
      event("transport", 30, 120, "ucx.wait", 5),
      event("step", 35, 65, "ring.reduce_scatter", 3),
  }));
  EXPECT_EQ(rank0(s).compute_ns, 90);        // [0, 90)
  EXPECT_EQ(rank0(s).communication_ns, 90);  // [30, 120)
  EXPECT_EQ(rank0(s).overlap_ns, 60);        // [30, 90)
  EXPECT_EQ(rank0(s).exposed_ns, 30);        // [90, 120)
  EXPECT_NEAR(*rank0(s).overlap_percent(), 66.667, 1e-3);
}

TEST(Overlap, InstantsAndOtherCategoriesAreNotCompute) {
  TimelineEvent marker = event("compute", 10, 10);
  marker.instant = true;
  const Summary s = summarize(one_rank({marker, event("bucket", 0, 100), event("comm", 0, 10)}));
  EXPECT_EQ(rank0(s).compute_ns, 0);
  EXPECT_EQ(rank0(s).exposed_ns, 10);
}

TEST(Overlap, WithoutCommunicationThereIsNoPercentage) {
  const Summary s = summarize(one_rank({event("compute", 0, 10)}));
  EXPECT_FALSE(rank0(s).overlap_percent().has_value());
}

TEST(Overlap, TheJobAddsRanksUpAndWeighsThemByCommunication) {
  Timeline timeline;
  timeline.world_size = 2;
  timeline.ranks.push_back(RankTimeline{
      .rank = 0, .events = {event("compute", 0, 100), event("comm", 50, 150)}});  // 50 of 100
  timeline.ranks.push_back(RankTimeline{
      .rank = 1, .events = {event("compute", 0, 100), event("comm", 0, 300)}});  // 100 of 300
  const Summary s = summarize(timeline);
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_DOUBLE_EQ(*s.ranks[0].figures.overlap_percent(), 50.0);
  EXPECT_NEAR(*s.ranks[1].figures.overlap_percent(), 33.333, 1e-3);
  EXPECT_EQ(s.job.figures.communication_ns, 400);
  EXPECT_EQ(s.job.figures.overlap_ns, 150);
  EXPECT_EQ(s.job.figures.exposed_ns, 250);
  EXPECT_DOUBLE_EQ(*s.job.figures.overlap_percent(), 37.5);
  EXPECT_EQ(s.job.figures.wall_ns, 300) << "the job's wall time is the longest rank's";
}

TEST(Latency, CollectivesGetCountBytesAndNearestRankPercentiles) {
  std::vector<TimelineEvent> events;
  for (int i = 1; i <= 100; ++i) {
    TimelineEvent e = event("comm", i * 1000, i * 1000 + i, "all_reduce");
    e.bytes = 8;
    events.push_back(e);
  }
  events.push_back(event("comm", 0, 7, "barrier"));
  const Summary s = summarize(one_rank(events));
  const LatencyStats& all_reduce = s.job.collectives.at("all_reduce");
  EXPECT_EQ(all_reduce.count, 100u);
  EXPECT_EQ(all_reduce.bytes, 800u);
  EXPECT_EQ(all_reduce.p50_ns, 50);
  EXPECT_EQ(all_reduce.p90_ns, 90);
  EXPECT_EQ(all_reduce.p99_ns, 99);
  EXPECT_EQ(all_reduce.max_ns, 100);
  EXPECT_EQ(all_reduce.total_ns, 5050);
  EXPECT_EQ(s.job.collectives.at("barrier").count, 1u);
}

// A small collective recorded one in n (sampling.hpp) carries "sampled" = n and stands
// for n calls; the n - 1 left out add its length and its overlap n - 1 more times.
TEST(Latency, ASampledSpanStandsForTheCallsItWasChosenFrom) {
  TimelineEvent sampled = event("comm", 90, 110, "all_reduce");  // half under compute
  sampled.bytes = 8;
  sampled.args.emplace_back("sampled", "64");
  TimelineEvent whole = event("comm", 200, 230, "all_reduce");  // recorded alone
  whole.bytes = 8;
  const Summary s = summarize(one_rank({event("compute", 0, 100), sampled, whole}));
  const LatencyStats& all_reduce = s.job.collectives.at("all_reduce");
  EXPECT_EQ(all_reduce.count, 65u);
  EXPECT_EQ(all_reduce.recorded, 2u);
  EXPECT_EQ(all_reduce.bytes, 65u * 8);
  EXPECT_EQ(all_reduce.total_ns, 64 * 20 + 30);
  EXPECT_EQ(all_reduce.max_ns, 30) << "the longest recorded span";
  EXPECT_EQ(rank0(s).communication_ns, 64 * 20 + 30);
  EXPECT_EQ(rank0(s).overlap_ns, 64 * 10);
  EXPECT_EQ(rank0(s).exposed_ns, 64 * 10 + 30);
  const std::string text = format_text(s);
  EXPECT_NE(text.find("~65"), std::string::npos) << text;
  EXPECT_NE(text.find("BRAID_TRACE_SAMPLE_EVERY"), std::string::npos) << text;
  const auto json = nlohmann::json::parse(format_json(s));
  EXPECT_EQ(json["job"]["collectives"]["all_reduce"]["count"], 65);
  EXPECT_EQ(json["job"]["collectives"]["all_reduce"]["recorded"], 2);
}

// Percentiles weigh a sampled span by its calls: one 10 ns span standing for 64 calls
// outweighs ten 100 ns spans recorded whole (a loop alternating a small and a large size).
TEST(Latency, PercentilesWeighSampledSpansByTheCallsTheyStandFor) {
  std::vector<TimelineEvent> events;
  TimelineEvent small = event("comm", 0, 10, "all_reduce");
  small.args.emplace_back("sampled", "64");
  events.push_back(small);
  for (int i = 1; i <= 10; ++i) {
    events.push_back(event("comm", i * 1000, i * 1000 + 100, "all_reduce"));
  }
  const LatencyStats& all_reduce = summarize(one_rank(events)).job.collectives.at("all_reduce");
  EXPECT_EQ(all_reduce.count, 74u);
  EXPECT_EQ(all_reduce.p50_ns, 10);
  EXPECT_EQ(all_reduce.p90_ns, 100);  // rank ceil(0.9 * 74) = 67 > 64
  EXPECT_EQ(all_reduce.max_ns, 100);
}

// A weight read from a file is clamped to what BRAID_TRACE_SAMPLE_EVERY accepts.
TEST(Latency, AnAbsurdSampledWeightIsClamped) {
  TimelineEvent huge = event("comm", 0, 1000, "all_reduce");
  huge.args.emplace_back("sampled", "9223372036854775807");
  const Summary s = summarize(one_rank({huge}));
  EXPECT_EQ(s.job.collectives.at("all_reduce").count, std::size_t{1} << 20);
  EXPECT_EQ(rank0(s).communication_ns, std::int64_t{1000} << 20);
}

TEST(Latency, BucketsAreKeyedByTheirIndexArgument) {
  TimelineEvent b0 = event("bucket", 0, 300, "bucket");
  b0.args.emplace_back("bucket", "0");
  TimelineEvent b1 = event("bucket", 100, 200, "bucket");
  b1.args.emplace_back("bucket", "1");
  TimelineEvent unnamed = event("bucket", 0, 50, "bucket");
  const Summary s = summarize(one_rank({b0, b1, unnamed}));
  ASSERT_EQ(s.job.buckets.size(), 2u);
  EXPECT_EQ(s.job.buckets.at(0).max_ns, 300);
  EXPECT_EQ(s.job.buckets.at(1).max_ns, 100);
}

TEST(Pipeline, BubbleIsTheIdleShareOfTheWindowBetweenFirstAndLastStage) {
  const Summary s =
      summarize(one_rank({event("pipeline", 0, 30, "F"), event("pipeline", 50, 100, "B")}));
  ASSERT_TRUE(s.ranks[0].bubble_percent.has_value());
  EXPECT_DOUBLE_EQ(*s.ranks[0].bubble_percent, 20.0);
  EXPECT_DOUBLE_EQ(*s.job.bubble_percent, 20.0);
  EXPECT_FALSE(summarize(one_rank({event("comm", 0, 1)})).job.bubble_percent.has_value());
}

TEST(Pipeline, AStageWaitingForItsFirstInputOrItsLastGradientIsInItsBubble) {
  // Two stages, one microbatch: stage 1 waits for the forward (the fill), stage 0 for the
  // backward (the drain); each computes half of the pipeline's window.
  Timeline timeline;
  timeline.world_size = 2;
  timeline.ranks.push_back(RankTimeline{
      .rank = 0, .events = {event("pipeline", 0, 10, "F"), event("pipeline", 30, 40, "B")}});
  timeline.ranks.push_back(RankTimeline{
      .rank = 1, .events = {event("pipeline", 10, 20, "F"), event("pipeline", 20, 30, "B")}});
  const Summary s = summarize(timeline);
  EXPECT_DOUBLE_EQ(*s.ranks[0].bubble_percent, 50.0);
  EXPECT_DOUBLE_EQ(*s.ranks[1].bubble_percent, 50.0);
  EXPECT_DOUBLE_EQ(*s.job.bubble_percent, 50.0);
}

TEST(Pipeline, ABackwardWaitingForItsDataParallelReductionIsNotComputing) {
  // The reduction launched its last bucket at 40 and wrote back at 70: 30 of the
  // backward's 100 are a wait.
  TimelineEvent launched = event("bucket", 40, 40, "bucket.launched");
  launched.instant = true;
  const Summary s = summarize(one_rank(
      {event("pipeline", 0, 100, "B"), launched, event("bucket", 70, 80, "bucket.write_back")}));
  EXPECT_DOUBLE_EQ(*s.ranks[0].bubble_percent, 30.0);
}

TEST(Pipeline, TheBubbleIsTheWindowsShareOutsideComputingWhereverItIsAsked) {
  EXPECT_DOUBLE_EQ(bubble_percent(3.0, 4.0), 25.0);
  EXPECT_DOUBLE_EQ(bubble_percent(1.0, 0.0), 0.0);  // an empty window has no bubble
  // Computing outside the window does not count; overlapping intervals count once.
  EXPECT_DOUBLE_EQ(bubble_percent(union_of({{-10, 5}, {2, 8}, {15, 30}}), {0, 20}), 35.0);
  EXPECT_EQ(difference_of({{0, 10}, {20, 30}}, {{5, 22}, {25, 26}}),
            (std::vector<Interval>{{0, 5}, {22, 25}, {26, 30}}));
}

TEST(Formats, TextHasTheTableAndJsonParsesWithTheSameFigures) {
  const Summary s =
      summarize(one_rank({event("compute", 0, 100), event("comm", 80, 180, "all_reduce")}));
  const std::string text = format_text(s);
  EXPECT_NE(text.find("overlap%"), std::string::npos) << text;
  EXPECT_NE(text.find("20.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("all_reduce"), std::string::npos) << text;
  const auto json = nlohmann::json::parse(format_json(s));
  EXPECT_EQ(json["ranks"][0]["rank"], 0);
  EXPECT_EQ(json["ranks"][0]["exposed_communication_ns"], 80);
  EXPECT_DOUBLE_EQ(json["job"]["overlap_percent"].get<double>(), 20.0);
  EXPECT_EQ(json["job"]["collectives"]["all_reduce"]["count"], 1);
  EXPECT_TRUE(json["job"]["pipeline_bubble_percent"].is_null());
  EXPECT_EQ(json["ranks"][0]["overwritten_records"], 0);
  // One rank: no call to match, so waiting is unknown and the table leaves it out; the
  // JSON counts every exposed nanosecond as transfer.
  EXPECT_EQ(text.find("transfer"), std::string::npos) << text;
  EXPECT_EQ(text.find("waiting"), std::string::npos) << text;
  EXPECT_EQ(json["ranks"][0]["matched_calls"], 0);
  EXPECT_EQ(json["ranks"][0]["waiting_ns"], 0);
  EXPECT_EQ(json["ranks"][0]["transfer_ns"], 80);
  EXPECT_TRUE(json["job"]["most_waited_for"].is_null());
}

TimelineEvent off_core(TimelineEvent e, std::int64_t ns) {
  e.args.emplace_back("off_core_ns", std::to_string(ns));
  return e;
}

// Compute spans' off-core time adds up per rank and over the job; a span nested in
// another on its track is inside that one's time already and counts once; spans on
// another track count on their own.
TEST(OffCore, ComputeSpansOffCoreTimeAddsUpOncePerTrack) {
  Timeline timeline;
  timeline.world_size = 2;
  timeline.ranks.push_back(RankTimeline{
      .rank = 0,
      .events = {off_core(event("compute", 0, 100, "backward"), 30),
                 off_core(event("compute", 10, 50, "inner"), 20),  // nested: counted above
                 event("comm", 40, 120, "all_reduce"),
                 off_core(event("compute", 60, 90, "other", 2), 5),
                 off_core(event("compute", 150, 200, "optimizer"), 7)}});
  timeline.ranks.push_back(RankTimeline{.rank = 1, .events = {event("compute", 0, 100)}});
  const Summary s = summarize(timeline);
  EXPECT_EQ(s.ranks[0].figures.compute_off_core_ns, 42);
  EXPECT_FALSE(s.ranks[1].figures.compute_off_core_ns.has_value()) << "no span carried it";
  EXPECT_EQ(s.job.figures.compute_off_core_ns, 42);
  const std::string text = format_text(s);
  EXPECT_NE(text.find("off-core"), std::string::npos) << text;
  EXPECT_NE(text.find("what it cost"), std::string::npos) << "the column is explained";
  const auto json = nlohmann::json::parse(format_json(s));
  EXPECT_EQ(json["ranks"][0]["compute_off_core_ns"], 42);
  EXPECT_FALSE(json["ranks"][1].contains("compute_off_core_ns"));
  EXPECT_EQ(json["job"]["compute_off_core_ns"], 42);
  // A foreign trace's off_core_ns that is not a count of nanoseconds is not ours: skipped.
  TimelineEvent foreign = event("compute", 0, 10);
  foreign.args.emplace_back("off_core_ns", "1e+20");
  EXPECT_FALSE(summarize(one_rank({foreign})).job.figures.compute_off_core_ns.has_value());
  // Without the argument anywhere there is no column.
  const std::string plain = format_text(summarize(one_rank({event("compute", 0, 100)})));
  EXPECT_EQ(plain.find("off-core"), std::string::npos) << plain;
}

// A rank whose recorder overwrote old records (BRAID_TRACE_BUFFER_MB) is named, with the
// count, so nobody mistakes its figures for the whole run's.
TEST(Formats, ARankThatOverwroteRecordsIsNamedWithTheCount) {
  Timeline timeline = one_rank({event("compute", 0, 100), event("comm", 80, 180, "all_reduce")});
  timeline.ranks[0].overwritten_records = 4096;
  const Summary s = summarize(timeline);
  const std::string text = format_text(s);
  EXPECT_NE(text.find("rank 0 overwrote its 4096 oldest records"), std::string::npos) << text;
  EXPECT_EQ(nlohmann::json::parse(format_json(s))["ranks"][0]["overwritten_records"], 4096);
}

// ---------------------------------------------------------------- waiting and transfer

constexpr std::int64_t kMs = 1'000'000;

// A collective's span as Communicator::run records it: communicator id and sequence number.
TimelineEvent call(std::int64_t comm, std::int64_t seq, std::int64_t begin, std::int64_t end,
                   std::string name = "all_reduce") {
  TimelineEvent e = event("comm", begin, end, std::move(name), 2);
  e.args.emplace_back("comm", std::to_string(comm));
  e.args.emplace_back("seq", std::to_string(seq));
  return e;
}

TimelineEvent sampled(TimelineEvent e, std::int64_t n) {
  e.args.emplace_back("sampled", std::to_string(n));
  return e;
}

Timeline ranks(std::vector<std::vector<TimelineEvent>> events) {
  Timeline timeline;
  timeline.world_size = static_cast<int>(events.size());
  for (std::size_t r = 0; r < events.size(); ++r) {
    timeline.ranks.push_back(RankTimeline{.rank = static_cast<int>(r), .events = events[r]});
  }
  return timeline;
}

// Three steps 100 ms apart: both ranks compute, then all-reduce until 25 ms into the step;
// rank 1 computes 5 ms longer, so rank 0 waits 5 ms for it at every call.
TEST(Waiting, ARankThatArrivesLateMakesTheOtherWaitAndIsNamed) {
  std::vector<std::vector<TimelineEvent>> events(2);
  for (std::int64_t step = 0; step < 3; ++step) {
    const std::int64_t t = step * 100 * kMs;
    events[0].push_back(event("compute", t, t + 10 * kMs, "backward"));
    events[0].push_back(call(1, step, t + 10 * kMs, t + 25 * kMs));
    events[1].push_back(event("compute", t, t + 15 * kMs, "backward"));
    events[1].push_back(call(1, step, t + 15 * kMs, t + 25 * kMs));
  }
  const Summary s = summarize(ranks(events));
  const OverlapFigures& early = s.ranks[0].figures;
  const OverlapFigures& late = s.ranks[1].figures;
  EXPECT_EQ(early.exposed_ns, 45 * kMs);
  EXPECT_EQ(early.waiting_ns, 15 * kMs);
  EXPECT_EQ(early.transfer_ns(), 30 * kMs);
  EXPECT_EQ(early.waited_for_ns, (std::map<int, std::int64_t>{{1, 15 * kMs}}));
  EXPECT_EQ(early.late_calls, 0);
  EXPECT_EQ(early.matched_calls, 3);
  EXPECT_EQ(late.waiting_ns, 0);
  EXPECT_EQ(late.transfer_ns(), 30 * kMs);
  EXPECT_EQ(late.late_calls, 3);
  EXPECT_EQ(s.job.figures.waiting_ns, 15 * kMs);
  EXPECT_EQ(s.job.figures.transfer_ns(), 60 * kMs);
  EXPECT_EQ(s.job.figures.late_calls, 3);
  EXPECT_EQ(s.job.figures.matched_calls, 6) << "each rank's part in each call";
  ASSERT_TRUE(s.job.figures.most_waited_for().has_value());
  EXPECT_EQ(s.job.figures.most_waited_for()->rank, 1);
  EXPECT_EQ(s.job.figures.most_waited_for()->waited_ns, 15 * kMs);

  const std::string text = format_text(s);
  EXPECT_NE(text.find("waiting: ranks waited 15.0 ms for rank 1 (20.0% of exposed), last to "
                      "arrive at 3 of its 3 calls\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(kWaitingNote), std::string::npos) << text;
  const auto json = nlohmann::json::parse(format_json(s));
  EXPECT_EQ(json["ranks"][0]["waiting_ns"], 15 * kMs);
  EXPECT_EQ(json["ranks"][0]["transfer_ns"], 30 * kMs);
  EXPECT_EQ(json["ranks"][0]["waited_for_ns"]["1"], 15 * kMs);
  EXPECT_EQ(json["ranks"][1]["late_calls"], 3);
  EXPECT_EQ(json["ranks"][1]["matched_calls"], 3);
  EXPECT_EQ(json["job"]["waiting_ns"], 15 * kMs);
  EXPECT_EQ(json["job"]["most_waited_for"]["rank"], 1);
  EXPECT_EQ(json["job"]["most_waited_for"]["waited_ns"], 15 * kMs);
  EXPECT_DOUBLE_EQ(json["job"]["most_waited_for"]["exposed_percent"].get<double>(), 20.0);
}

// Three ranks: rank 1 arrives 5 ms after rank 0 and rank 2 after 2 ms at the first two
// calls; at the third, rank 2 is last, 4 ms after the others. Every call ends at 8 ms.
TEST(Waiting, EachRankWaitsUntilTheLastArrivalAndTheJobNamesWhomItWaitedForMost) {
  std::vector<std::vector<TimelineEvent>> events(3);
  const std::vector<std::vector<std::int64_t>> arrivals = {{0, 5, 2}, {0, 5, 2}, {0, 0, 4}};
  for (std::size_t seq = 0; seq < arrivals.size(); ++seq) {
    const auto t = static_cast<std::int64_t>(seq) * 10 * kMs;
    for (std::size_t r = 0; r < 3; ++r) {
      events[r].push_back(
          call(1, static_cast<std::int64_t>(seq), t + arrivals[seq][r] * kMs, t + 8 * kMs));
    }
  }
  const Summary s = summarize(ranks(events));
  EXPECT_EQ(s.ranks[0].figures.waited_for_ns,
            (std::map<int, std::int64_t>{{1, 10 * kMs}, {2, 4 * kMs}}));
  EXPECT_EQ(s.ranks[1].figures.waited_for_ns, (std::map<int, std::int64_t>{{2, 4 * kMs}}));
  EXPECT_EQ(s.ranks[2].figures.waited_for_ns, (std::map<int, std::int64_t>{{1, 6 * kMs}}));
  EXPECT_EQ(s.ranks[2].figures.waiting_ns, 6 * kMs);
  EXPECT_EQ(s.ranks[2].figures.transfer_ns(), 10 * kMs);
  EXPECT_EQ(s.ranks[1].figures.late_calls, 2);
  EXPECT_EQ(s.ranks[2].figures.late_calls, 1);
  EXPECT_EQ(s.job.figures.waited_for_ns,
            (std::map<int, std::int64_t>{{1, 16 * kMs}, {2, 8 * kMs}}));
  EXPECT_EQ(s.job.figures.waiting_ns, 24 * kMs);
  EXPECT_EQ(s.job.figures.exposed_ns, 54 * kMs);  // 24 waiting, 3 + 3 + 4 transfer per rank
  EXPECT_EQ(s.job.figures.most_waited_for()->rank, 1);
  const std::string text = format_text(s);
  EXPECT_NE(text.find("ranks waited 16.0 ms for rank 1 (29.6% of exposed), last to arrive at 2 "
                      "of its 3 calls; 8.00 ms for 1 other rank"),
            std::string::npos)
      << text;
}

// Rank 0 starts the all-reduce while it still computes (an overlapped bucket): the part of
// its wait under compute is hidden, like any communication under compute, not waiting.
TEST(Waiting, ComputeOverlappingTheWaitHidesItRatherThanCountingIt) {
  const Summary s =
      summarize(ranks({{event("compute", 0, 12 * kMs), call(1, 0, 10 * kMs, 25 * kMs)},
                       {call(1, 0, 15 * kMs, 25 * kMs)}}));
  const OverlapFigures& f = s.ranks[0].figures;
  EXPECT_EQ(f.exposed_ns, 13 * kMs);
  EXPECT_EQ(f.waiting_ns, 3 * kMs) << "[10, 15) waiting, [10, 12) of it under compute";
  EXPECT_EQ(f.transfer_ns(), 10 * kMs);
  // All of the wait under compute: rank 1 still arrived last, nobody's exposure waited.
  const Summary hidden =
      summarize(ranks({{event("compute", 0, 20 * kMs), call(1, 0, 10 * kMs, 25 * kMs)},
                       {call(1, 0, 15 * kMs, 25 * kMs)}}));
  EXPECT_EQ(hidden.ranks[0].figures.waiting_ns, 0);
  EXPECT_TRUE(hidden.ranks[0].figures.waited_for_ns.empty());
  EXPECT_EQ(hidden.ranks[1].figures.late_calls, 1);
  const std::string text = format_text(hidden);
  EXPECT_NE(text.find("waiting"), std::string::npos) << "matched: the columns are there";
  EXPECT_EQ(text.find("ranks waited"), std::string::npos) << text;
}

// Nothing to compare a call with, nothing to wait for: a call only one rank recorded,
// and spans without "comm" (point-to-point, NCCL, traces from before it) are transfer.
TEST(Waiting, ACallRecordedOnOneRankOnlyOrWithoutItsCommunicatorIsTransfer) {
  TimelineEvent older = event("comm", 20 * kMs, 30 * kMs, "all_reduce");
  older.args.emplace_back("seq", "1");
  TimelineEvent older_late = event("comm", 25 * kMs, 30 * kMs, "all_reduce");
  older_late.args.emplace_back("seq", "1");
  const Summary s =
      summarize(ranks({{call(1, 0, 0, 10 * kMs), older, event("comm", 40 * kMs, 50 * kMs, "send")},
                       {older_late, event("comm", 45 * kMs, 50 * kMs, "recv")}}));
  EXPECT_EQ(s.ranks[0].figures.exposed_ns, 30 * kMs);
  EXPECT_EQ(s.job.figures.waiting_ns, 0);
  EXPECT_EQ(s.job.figures.transfer_ns(), s.job.figures.exposed_ns);
  EXPECT_EQ(s.job.figures.late_calls, 0);
  EXPECT_EQ(s.job.figures.matched_calls, 0);
  EXPECT_FALSE(s.job.figures.most_waited_for().has_value());
  EXPECT_EQ(format_text(s).find("waiting"), std::string::npos) << "unknown, not zero";
}

// The same sequence number on two communicators is two calls: each rank alone in a
// communicator of its own (1 and 2) waits for nobody there, and in the one they share (3)
// rank 0 waits 4 ms. Matched by sequence number alone, rank 0 would wait 5 + 4 ms.
TEST(Waiting, CallsOnDifferentCommunicatorsAreNeverMatched) {
  const Summary s =
      summarize(ranks({{call(1, 0, 0, 10 * kMs), call(3, 0, 20 * kMs, 30 * kMs)},
                       {call(2, 0, 5 * kMs, 10 * kMs), call(3, 0, 24 * kMs, 30 * kMs)}}));
  EXPECT_EQ(s.ranks[0].figures.waited_for_ns, (std::map<int, std::int64_t>{{1, 4 * kMs}}));
  EXPECT_EQ(s.ranks[1].figures.waiting_ns, 0);
  EXPECT_EQ(s.ranks[1].figures.late_calls, 1);
}

// A sampled span stands for n calls: its wait outside compute counts n - 1 more times, as
// its length does in communication; the late rank arrived last at n calls.
TEST(Waiting, ASampledCallsWaitCountsForTheCallsItStandsFor) {
  const Summary s = summarize(ranks({{event("compute", 0, 4), sampled(call(1, 64, 0, 20), 64)},
                                     {sampled(call(1, 64, 10, 20), 64)}}));
  const OverlapFigures& f = s.ranks[0].figures;
  EXPECT_EQ(f.exposed_ns, 64 * 16);
  EXPECT_EQ(f.waiting_ns, 64 * 6) << "[0, 10) waiting, [0, 4) of it under compute";
  EXPECT_EQ(f.transfer_ns(), 64 * 10);
  EXPECT_EQ(s.ranks[1].figures.late_calls, 64);
  EXPECT_EQ(s.ranks[1].figures.transfer_ns(), 64 * 10);
}

// Two collectives in flight at once on two communicators, each waiting for another rank:
// the time both waits cover counts once, for the one that began first.
TEST(Waiting, WaitsThatOverlapCountOnceForTheCallThatBeganFirst) {
  const Summary s = summarize(ranks({
      {call(1, 0, 0, 10 * kMs), call(2, 0, 5 * kMs, 20 * kMs)},
      {call(1, 0, 8 * kMs, 10 * kMs)},
      {call(2, 0, 15 * kMs, 20 * kMs)},
  }));
  const OverlapFigures& f = s.ranks[0].figures;
  EXPECT_EQ(f.waited_for_ns, (std::map<int, std::int64_t>{{1, 8 * kMs}, {2, 7 * kMs}}));
  EXPECT_EQ(f.waiting_ns, 15 * kMs);
  EXPECT_EQ(f.exposed_ns, 20 * kMs);
}

// A staged CUDA call runs its chunks one after another under one sequence number: the
// k-th chunk on one rank is matched with the k-th on the other.
TEST(Waiting, ChunksUnderOneSequenceNumberAreMatchedInTheirOrder) {
  const Summary s = summarize(
      ranks({{call(1, 3, 0, 10), call(1, 3, 10, 20)}, {call(1, 3, 5, 10), call(1, 3, 12, 20)}}));
  EXPECT_EQ(s.ranks[0].figures.waiting_ns, 5 + 2);
  EXPECT_EQ(s.ranks[1].figures.late_calls, 2);
}

// Figures gathered from ranks by other means add up as summarize() adds them.
TEST(Waiting, AddingRankFiguresSumsWaitingPerLateRank) {
  OverlapFigures job;
  add_rank_figures(job, {.exposed_ns = 10, .waiting_ns = 6, .waited_for_ns = {{1, 6}}});
  add_rank_figures(
      job, {.exposed_ns = 9, .waiting_ns = 5, .waited_for_ns = {{0, 1}, {1, 4}}, .late_calls = 2});
  EXPECT_EQ(job.waiting_ns, 11);
  EXPECT_EQ(job.transfer_ns(), 8);
  EXPECT_EQ(job.waited_for_ns, (std::map<int, std::int64_t>{{0, 1}, {1, 10}}));
  EXPECT_EQ(job.late_calls, 2);
  EXPECT_EQ(job.most_waited_for()->rank, 1);
}

}  // namespace
}  // namespace braid::trace
