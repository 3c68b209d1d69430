#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <optional>
#include <pthread.h>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <braid/trace/recorder.hpp>
#include <braid/trace/region.hpp>
#include <braid/trace/span.hpp>

namespace braid::trace {
namespace {

class Recorder : public ::testing::Test {
 protected:
  void SetUp() override {
    set_enabled(true);
    clear();
  }
  void TearDown() override {
    set_enabled(false);
    clear();
  }
};

std::vector<Record> records_on(const Snapshot& snap, std::uint32_t track) {
  std::vector<Record> out;
  for (const Record& r : snap.records) {
    if (r.track == track) out.push_back(r);
  }
  return out;
}

const TrackInfo* find_track(const Snapshot& snap, std::uint32_t id) {
  for (const TrackInfo& t : snap.tracks) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

TEST_F(Recorder, OffRecordsNothing) {
  set_enabled(false);
  {
    Span span(Category::comm, "all_reduce", {}, 64);
    EXPECT_FALSE(span.active());
    AsyncSpan op = begin(Category::bucket, "bucket");
    EXPECT_FALSE(op.active());
    instant(Category::hook, "hook fired");
    counter(Category::comm, "in flight", 3);
  }
  EXPECT_TRUE(snapshot().records.empty());
}

TEST_F(Recorder, NestedSpansKeepTheirOrderBytesArgsAndThreadTrack) {
  {
    Span outer(Category::comm, "all_reduce", {}, 4096);
    outer.arg("seq", 7);
    {
      Span inner(Category::transport, "send", {}, 1024);
      inner.set_bytes(2048);
    }
  }
  Snapshot snap = snapshot();
  ASSERT_EQ(snap.records.size(), 2u);
  const Record& outer = snap.records[0];
  const Record& inner = snap.records[1];
  EXPECT_EQ(std::string_view(outer.name), "all_reduce");
  EXPECT_EQ(outer.category, Category::comm);
  EXPECT_EQ(outer.kind, RecordKind::span);
  EXPECT_EQ(outer.bytes, 4096u);
  ASSERT_EQ(outer.arg_count, 1);
  EXPECT_EQ(std::string_view(outer.args[0].key), "seq");
  EXPECT_EQ(outer.args[0].value, 7);
  EXPECT_EQ(std::string_view(inner.name), "send");
  EXPECT_EQ(inner.bytes, 2048u);
  EXPECT_LE(outer.begin_ns, inner.begin_ns);
  EXPECT_LE(inner.begin_ns, inner.end_ns);
  EXPECT_LE(inner.end_ns, outer.end_ns);

  EXPECT_NE(outer.track, 0u);
  EXPECT_EQ(outer.track, inner.track);
  const TrackInfo* info = find_track(snap, outer.track);
  ASSERT_NE(info, nullptr);
  EXPECT_TRUE(info->thread);
  EXPECT_EQ(info->os_thread_id, gettid());
}

TEST_F(Recorder, ArgumentsBeyondTheLimitAreDropped) {
  {
    Span span(Category::user, "many args");
    span.arg("a", 1);
    span.arg("b", 2);
    span.arg("c", 3);
    span.arg("d", 4);
  }
  static_assert(kMaxArgs == 3, "the span above passes one argument more than the limit");
  Snapshot snap = snapshot();
  ASSERT_EQ(snap.records.size(), 1u);
  EXPECT_EQ(snap.records[0].arg_count, kMaxArgs);
  EXPECT_EQ(snap.records[0].args[2].value, 3);
}

std::optional<std::int64_t> arg_of(const Record& r, std::string_view key) {
  for (std::uint8_t i = 0; i < r.arg_count; ++i) {
    if (std::string_view(r.args[i].key) == key) return r.args[i].value;
  }
  return std::nullopt;
}

// A compute region records how long its thread was off its core: a thread that sleeps
// through it is off for about the sleep, one that computes stays near zero; a user
// argument keeps its place beside it.
TEST_F(Recorder, ComputeRegionsRecordTheTimeTheirThreadSpentOffItsCore) {
  using namespace std::chrono_literals;
  {
    ComputeRegion sleeping("sleeping");
    sleeping.arg("step", 3);
    std::this_thread::sleep_for(30ms);
  }
  {
    // Spins until the thread has had 30 ms of its core, however long other processes keep
    // it waiting (two cores, tests in parallel): whatever the wall time, 30 ms of it is on-core.
    ComputeRegion spinning("spinning");
    const auto cpu_ns = [] {
      timespec t{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
      return std::int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
    };
    const std::int64_t until = cpu_ns() + 30'000'000;
    while (cpu_ns() < until) {
    }
  }
  std::optional<Record> sleeping, spinning;
  for (const Record& r : snapshot().records) {
    if (std::string_view(r.name) == "sleeping") sleeping = r;
    if (std::string_view(r.name) == "spinning") spinning = r;
  }
  ASSERT_TRUE(sleeping && spinning);
  EXPECT_EQ(sleeping->category, Category::compute);
  EXPECT_EQ(arg_of(*sleeping, "step"), 3);
  ASSERT_TRUE(arg_of(*sleeping, "off_core_ns"));
  EXPECT_GE(*arg_of(*sleeping, "off_core_ns"), 25'000'000);
  ASSERT_TRUE(arg_of(*spinning, "off_core_ns"));
  // Off-core is wall time less the thread's CPU time, and the spin had 30 ms of CPU.
  EXPECT_LE(*arg_of(*spinning, "off_core_ns"), spinning->end_ns - spinning->begin_ns - 25'000'000);
}

TEST_F(Recorder, NamedTracksInternToStableIds) {
  const Track comm = track("nccl comm 0");
  EXPECT_NE(comm.id, 0u);
  EXPECT_EQ(track("nccl comm 0"), comm);
  const Track stream = track("cuda stream 7");
  EXPECT_NE(stream, comm);
  EXPECT_EQ(track("cuda stream 7"), stream);
  { Span span(Category::comm, "all_reduce", comm); }
  Snapshot snap = snapshot();
  ASSERT_EQ(snap.records.size(), 1u);
  EXPECT_EQ(snap.records[0].track, comm.id);
  const TrackInfo* info = find_track(snap, comm.id);
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->name, "nccl comm 0");
  EXPECT_FALSE(info->thread);
  clear();
  EXPECT_EQ(track("nccl comm 0"), comm);  // clear() keeps tracks
}

TEST_F(Recorder, InternedNamesAreStableAndShared) {
  std::string built = "ring";
  built += "_allreduce";
  const Name a = intern(built);
  built = "something else";
  const Name b = intern("ring_allreduce");
  EXPECT_EQ(a.c_str(), b.c_str());
  EXPECT_EQ(a.view(), "ring_allreduce");
  { Span span(Category::comm, a); }
  EXPECT_EQ(std::string_view(snapshot().records.at(0).name), "ring_allreduce");
}

TEST_F(Recorder, SpansFromManyThreadsIncludingExitedOnesAllAppear) {
  constexpr int kThreads = 4;
  constexpr int kSpansPerThread = 3000;  // crosses chunk boundaries
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < kSpansPerThread; ++i) {
        Span span(Category::compute, "step", {}, static_cast<std::uint64_t>(i));
      }
    });
  }
  for (auto& t : threads) t.join();  // every writer has exited

  Snapshot snap = snapshot();
  ASSERT_EQ(snap.records.size(), std::size_t{kThreads} * kSpansPerThread);
  std::set<std::uint32_t> tracks;
  std::set<std::int64_t> os_threads;
  for (const Record& r : snap.records) tracks.insert(r.track);
  ASSERT_EQ(tracks.size(), std::size_t{kThreads});
  for (std::uint32_t id : tracks) {
    const TrackInfo* info = find_track(snap, id);
    ASSERT_NE(info, nullptr);
    EXPECT_TRUE(info->thread);
    os_threads.insert(info->os_thread_id);
    const std::vector<Record> mine = records_on(snap, id);
    ASSERT_EQ(mine.size(), std::size_t{kSpansPerThread});
    for (int i = 0; i < kSpansPerThread; ++i) {
      EXPECT_EQ(mine[i].bytes, static_cast<std::uint64_t>(i));
      if (i > 0) {
        EXPECT_LE(mine[i - 1].begin_ns, mine[i].begin_ns);
      }
    }
  }
  EXPECT_EQ(os_threads.size(), std::size_t{kThreads});
}

TEST_F(Recorder, ThreadTrackIsNamedAfterTheThread) {
  std::uint32_t id = 0;
  std::thread worker([&] {
    pthread_setname_np(pthread_self(), "grad-worker");
    Span span(Category::hook, "hook");
    id = detail::resolve({});
  });
  worker.join();
  Snapshot snap = snapshot();
  const TrackInfo* info = find_track(snap, id);
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->name, "grad-worker");
}

TEST_F(Recorder, AsyncSpanEndedOnAnotherThreadStaysOnTheTrackItBeganOn) {
  AsyncSpan first = begin(Category::bucket, "bucket 0", {}, 100);
  AsyncSpan second = begin(Category::bucket, "bucket 1", {}, 200);
  const std::uint32_t here = detail::resolve({});
  std::thread other([&] {
    first.end();
    first.end();  // once only
  });
  other.join();
  AsyncSpan moved = std::move(second);
  EXPECT_FALSE(second.active());  // NOLINT(bugprone-use-after-move): checking the moved-from state
  moved.arg("bucket", 1);
  // `moved` ends at scope exit, after `first`: the two overlap without nesting.
  { AsyncSpan scoped = std::move(moved); }
  Snapshot snap = snapshot();
  ASSERT_EQ(snap.records.size(), 2u);
  for (const Record& r : snap.records) {
    EXPECT_EQ(r.track, here);
    EXPECT_EQ(r.kind, RecordKind::async_span);
  }
  EXPECT_EQ(std::string_view(snap.records[0].name), "bucket 0");
  EXPECT_EQ(snap.records[1].bytes, 200u);
  EXPECT_EQ(snap.records[1].args[0].value, 1);
  EXPECT_LT(snap.records[0].end_ns, snap.records[1].end_ns);
}

TEST_F(Recorder, InstantsAndCountersAreRecordedAtOnePoint) {
  const Track comm = track("comm for counters");
  instant(Category::hook, "grad ready", {}, 512);
  counter(Category::comm, "buckets in flight", 3, comm);
  Snapshot snap = snapshot();
  ASSERT_EQ(snap.records.size(), 2u);
  const Record& point =
      snap.records[0].kind == RecordKind::instant ? snap.records[0] : snap.records[1];
  const Record& value =
      snap.records[0].kind == RecordKind::counter ? snap.records[0] : snap.records[1];
  EXPECT_EQ(point.kind, RecordKind::instant);
  EXPECT_EQ(point.begin_ns, point.end_ns);
  EXPECT_EQ(point.bytes, 512u);
  EXPECT_NE(point.track, 0u);
  EXPECT_EQ(value.kind, RecordKind::counter);
  EXPECT_EQ(value.track, comm.id);
  ASSERT_EQ(value.arg_count, 1);
  EXPECT_EQ(value.args[0].value, 3);
}

TEST_F(Recorder, ClearDiscardsRecordsWhileAnotherThreadKeepsRecording) {
  constexpr int kSpans = 20000;
  std::atomic<bool> started{false};
  std::atomic<std::uint32_t> writer_track{0};
  std::atomic<bool> may_exit{false};
  std::thread writer([&] {
    writer_track = detail::resolve({});
    started = true;
    for (int i = 0; i < kSpans; ++i) {
      Span span(Category::compute, "tick", {}, static_cast<std::uint64_t>(i));
    }
    while (!may_exit) std::this_thread::yield();
  });
  while (!started) std::this_thread::yield();
  for (int i = 0; i < 20; ++i) {
    clear();
    (void)snapshot();
  }
  clear();
  // Whatever survives the last clear is a gap-free suffix of what the writer recorded.
  auto check_suffix = [&] {
    const std::vector<Record> mine = records_on(snapshot(), writer_track);
    std::size_t gaps = 0;
    for (std::size_t i = 1; i < mine.size(); ++i) {
      if (mine[i].bytes != mine[i - 1].bytes + 1) ++gaps;
    }
    EXPECT_EQ(gaps, 0u);
    if (!mine.empty()) {
      EXPECT_LE(mine.back().bytes, std::uint64_t{kSpans - 1});
    }
  };
  check_suffix();
  may_exit = true;
  writer.join();
  check_suffix();
  clear();  // frees the exited writer's buffer
  EXPECT_TRUE(records_on(snapshot(), writer_track).empty());
}

// Past BRAID_TRACE_BUFFER_MB (here: the smallest limit, so no thread may grow past its
// first chunk), a thread overwrites its own oldest records: what stays is the newest,
// gap-free, and the snapshot counts the rest. Snapshots taken meanwhile read whole records.
TEST_F(Recorder, PastTheMemoryLimitAThreadKeepsItsNewestRecordsAndCountsTheRest) {
  constexpr std::uint64_t kSpans = 50000;  // several chunks' worth
  set_buffer_limit(1);
  std::atomic<std::uint32_t> writer_track{0};
  std::atomic<bool> done{false};
  std::thread writer([&] {
    writer_track = detail::resolve({});
    for (std::uint64_t i = 0; i < kSpans; ++i) Span span(Category::compute, "tick", {}, i);
    done = true;
  });
  while (!done) {
    for (const Record& r : snapshot().records) ASSERT_STREQ(r.name, "tick");
  }
  writer.join();
  const Snapshot snap = snapshot();
  const std::vector<Record> kept = records_on(snap, writer_track);
  ASSERT_FALSE(kept.empty());
  EXPECT_LT(kept.size(), kSpans);
  EXPECT_EQ(kept.size() + snap.overwritten, kSpans);
  EXPECT_EQ(kept.back().bytes, kSpans - 1);
  for (std::size_t i = 1; i < kept.size(); ++i) ASSERT_EQ(kept[i].bytes, kept[i - 1].bytes + 1);
  clear();
  EXPECT_EQ(snapshot().overwritten, 0u);
  set_buffer_limit(std::size_t{256} << 20);
}

// Threads that have exited give up their oldest chunks first: a thread recording after
// them keeps as much as the limit allows, not one chunk, and threads that come and go do
// not grow the records past the limit.
TEST_F(Recorder, AtTheLimitExitedThreadsGiveUpTheirRecordsBeforeLiveOnes) {
  constexpr std::uint64_t kSpans = 200000;
  set_buffer_limit(std::size_t{8} << 20);
  auto record = [](std::uint64_t n) {
    std::uint32_t track = 0;
    std::thread writer([&] {
      track = detail::resolve({});
      for (std::uint64_t i = 0; i < n; ++i) Span span(Category::compute, "tick", {}, i);
    });
    writer.join();
    return track;
  };
  const std::uint32_t first = record(kSpans);
  for (int i = 0; i < 50; ++i) record(10);  // threads that come and go
  const std::uint32_t second = record(kSpans);
  const Snapshot snap = snapshot();
  const std::size_t kept_first = records_on(snap, first).size();
  const std::size_t kept_second = records_on(snap, second).size();
  // The later thread got nearly all the limit holds; the records stay within it, but for
  // the chunk a thread writes into as it starts (the main thread's, here) and one more.
  const std::size_t limit_records = (std::size_t{8} << 20) / sizeof(Record);
  EXPECT_GT(kept_second, limit_records * 3 / 5);
  EXPECT_LT(kept_first, kept_second);
  EXPECT_LT(snap.records.size(), limit_records + 2 * 4096) << "the records grew past the limit";
  clear();
  set_buffer_limit(std::size_t{256} << 20);
}

// Threads that fill their chunks at the same moment do not all grow past the limit
// together: every one counts its next chunk in before it makes it.
TEST_F(Recorder, ThreadsRecordingAtOnceStayWithinTheLimitTogether) {
  constexpr int kThreads = 4;
  constexpr std::uint64_t kSpans = 60000;
  const std::size_t limit_bytes = std::size_t{4} << 20;
  set_buffer_limit(limit_bytes);
  std::atomic<int> ready{0};
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&] {
      detail::resolve({});  // registered, holding its first chunk
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }
      for (std::uint64_t i = 0; i < kSpans; ++i) Span span(Category::compute, "tick", {}, i);
    });
  }
  for (std::thread& writer : writers) writer.join();
  const Snapshot snap = snapshot();
  EXPECT_EQ(snap.records.size() + snap.overwritten, kThreads * kSpans);
  // Within the limit, but for the chunk the main thread (which recorded nothing) holds.
  const std::size_t limit_records = limit_bytes / sizeof(Record);
  EXPECT_LE(snap.records.size(), limit_records + 4096) << "the records grew past the limit";
  EXPECT_GT(snap.overwritten, 0u);
  clear();
  set_buffer_limit(std::size_t{256} << 20);
}

}  // namespace
}  // namespace braid::trace
