// gather_timeline: every rank's timeline at the root, on one clock, so a training program
// can summarise its job in-process (and tell waiting for a late rank from transfer). Ranks
// are threads here and share one recorder, so each passes a snapshot of its own making.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/collectives/gather_timeline.hpp>
#include <braid/core/error.hpp>
#include <braid/trace/summary.hpp>
#include <braid/trace/timeline_bytes.hpp>

#include "../support/rank_threads.hpp"

namespace braid::collectives {
namespace {

constexpr std::int64_t kMs = 1'000'000;

// Rank r's own clock reads `skew` more than rank 0's; its all-reduces begin `late` after
// rank 0's (in true time) and all of them end together, 10 ms after rank 0 began.
trace::Snapshot all_reduces(std::int64_t skew, std::int64_t late, int calls) {
  trace::Snapshot snapshot;
  snapshot.tracks.push_back({.id = 1, .name = "comm 0"});
  for (int i = 0; i < calls; ++i) {
    trace::Record r;
    const std::int64_t start = (100 + 20 * i) * kMs;
    r.begin_ns = start + late + skew;
    r.end_ns = start + 10 * kMs + skew;
    r.bytes = 4096;
    r.name = "all_reduce";
    r.category = trace::Category::comm;
    r.track = 1;
    r.args[0] = {.key = "comm", .value = 0};
    r.args[1] = {.key = "seq", .value = i};
    r.arg_count = 2;
    r.ns = true;
    snapshot.records.push_back(r);
  }
  return snapshot;
}

TEST(GatherTimeline, TheRootGetsEveryRanksEventsOnItsClockAndSeesTheLateRank) {
  constexpr int kCalls = 4;
  const auto errors =
      testing::run_blocking_ranks(2, [](int rank, std::shared_ptr<Communicator> comm) {
        // Rank 1 runs 5 s ahead on its own clock and arrives 4 ms late at every call.
        const std::int64_t skew = rank == 1 ? 5000 * kMs : 0;
        const std::int64_t late = rank == 1 ? 4 * kMs : 0;
        const trace::ClockAlignment clock{.reference_rank = 0, .offset_ns = -skew};
        auto timeline =
            comm->launch(gather_timeline(*comm, all_reduces(skew, late, kCalls), clock)).get();
        if (rank != 0) {
          EXPECT_FALSE(timeline.has_value());
          return;
        }
        ASSERT_TRUE(timeline.has_value());
        ASSERT_EQ(timeline->ranks.size(), 2u);
        EXPECT_EQ(timeline->ranks[1].rank, 1);
        ASSERT_EQ(timeline->ranks[1].events.size(), std::size_t{kCalls});
        // On one base: rank 1's first call begins 4 ms after rank 0's, and both end together.
        EXPECT_EQ(timeline->ranks[0].events[0].begin_ns, 0);
        EXPECT_EQ(timeline->ranks[1].events[0].begin_ns, 4 * kMs);
        EXPECT_EQ(timeline->ranks[1].events[0].end_ns, timeline->ranks[0].events[0].end_ns);
        EXPECT_EQ(timeline->ranks[1].track_names.at(1), "comm 0");
        const trace::Summary summary = trace::summarize(*timeline);
        // Rank 0 waited 4 ms a call for rank 1, then both moved the bytes for 6 ms.
        EXPECT_EQ(summary.ranks[0].figures.exposed_ns, kCalls * 10 * kMs);
        EXPECT_EQ(summary.ranks[0].figures.waiting_ns, kCalls * 4 * kMs);
        EXPECT_EQ(summary.ranks[1].figures.waiting_ns, 0);
        EXPECT_EQ(summary.ranks[1].figures.transfer_ns(), kCalls * 6 * kMs);
      });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(TimelineBytes, RoundTripsEveryField) {
  trace::RankTimeline rank;
  rank.rank = 3;
  rank.host = "node7";
  rank.overwritten_records = 12;
  rank.track_names = {{1, "main"}, {9, "comm 2"}};
  rank.events.push_back({.name = "backward",
                         .category = "compute",
                         .track = 1,
                         .begin_ns = 5,
                         .end_ns = 50,
                         .bytes = 0,
                         .instant = false,
                         .args = {{"off_core_ns", "7"}}});
  rank.events.push_back({.name = "marker",
                         .category = "user",
                         .track = 9,
                         .begin_ns = 60,
                         .end_ns = 60,
                         .bytes = 8,
                         .instant = true,
                         .args = {}});
  const auto back = trace::timeline_from_bytes(trace::timeline_to_bytes(rank, -42));
  EXPECT_EQ(back.origin_reference_ns, -42);
  EXPECT_EQ(back.rank.rank, 3);
  EXPECT_EQ(back.rank.host, "node7");
  EXPECT_EQ(back.rank.overwritten_records, 12u);
  EXPECT_EQ(back.rank.track_names, rank.track_names);
  ASSERT_EQ(back.rank.events.size(), 2u);
  EXPECT_EQ(back.rank.events[0].name, "backward");
  EXPECT_EQ(back.rank.events[0].arg("off_core_ns"), "7");
  EXPECT_EQ(back.rank.events[1].end_ns, 60);
  EXPECT_TRUE(back.rank.events[1].instant);
  EXPECT_EQ(back.rank.events[1].bytes, 8u);
}

TEST(TimelineBytes, TruncatedOrForeignBytesAreAProtocolErrorNotACrash) {
  trace::RankTimeline rank;
  rank.events.push_back({.name = "x", .category = "comm", .track = 1, .begin_ns = 1, .end_ns = 2});
  const std::string bytes = trace::timeline_to_bytes(rank, 0);
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_THROW(trace::timeline_from_bytes(std::string_view(bytes).substr(0, cut)), Error) << cut;
  }
  std::string huge_count = bytes;
  // The event count sits just before the first event: claim four billion of them.
  const std::size_t count_at = bytes.size() - (4 + 1 + 4 + 4 + 4 + 8 + 8 + 8 + 1 + 4 + 4);
  huge_count.replace(count_at, 4, std::string(4, '\xff'));
  EXPECT_THROW(trace::timeline_from_bytes(huge_count), Error);
  EXPECT_THROW(trace::timeline_from_bytes(bytes + "z"), Error);
  EXPECT_THROW(trace::timeline_from_bytes("not a timeline at all"), Error);
}

}  // namespace
}  // namespace braid::collectives
