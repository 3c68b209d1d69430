// Overlap and exposed communication against hand-built timelines whose answers are known:
// disjoint, nested, partial, several lanes, several ranks; and the latency tables.
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

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
  const Summary s = summarize(
      one_rank({event("pipeline", 0, 30, "forward"), event("pipeline", 50, 100, "backward")}));
  ASSERT_TRUE(s.ranks[0].bubble_percent.has_value());
  EXPECT_DOUBLE_EQ(*s.ranks[0].bubble_percent, 20.0);
  EXPECT_DOUBLE_EQ(*s.job.bubble_percent, 20.0);
  EXPECT_FALSE(summarize(one_rank({event("comm", 0, 1)})).job.bubble_percent.has_value());
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

}  // namespace
}  // namespace braid::trace
