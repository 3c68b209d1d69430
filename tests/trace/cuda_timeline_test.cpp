// GPU suite: every test that needs a device skips itself when cudaGetDeviceCount finds
// none. The measured work is cudaMemsetAsync on a device buffer (braid compiles no
// kernels), big enough to take tens of microseconds, and a host function blocking on a
// latch where a test must hold the stream back.
#include <cstddef>
#include <cstdint>
#include <latch>
#include <string_view>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <braid/core/cuda_error.hpp>
#include <braid/core/cuda_stream.hpp>
#include <braid/core/enforce.hpp>
#include <braid/trace/cuda_timeline.hpp>
#include <braid/trace/output.hpp>
#include <braid/trace/recorder.hpp>

#include "../support/cuda_device.hpp"

namespace braid {
namespace {

using namespace std::chrono_literals;

using braid::testing::has_cuda_device;

class CudaTimelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_cuda_device()) GTEST_SKIP() << "no CUDA device";
    trace::set_enabled(true);
    trace::clear();
  }
  void TearDown() override {
    trace::set_enabled(false);
    trace::clear();
  }
};

// A device buffer, freed at scope exit. 64 MiB: a memset of it takes tens of
// microseconds even on the fastest GPUs, far above the event timer's ~0.5 us.
struct DeviceBuffer {
  explicit DeviceBuffer(std::size_t n = std::size_t{64} << 20) : bytes(n) {
    BRAID_CUDA_CHECK(cudaMalloc(&data, bytes));
  }
  ~DeviceBuffer() { (void)cudaFree(data); }
  void fill(CudaStream& stream, int value) {
    BRAID_CUDA_CHECK(cudaMemsetAsync(data, value, bytes, stream.native()));
  }
  std::size_t bytes;
  void* data = nullptr;
};

// Holds a CUDA stream inside a host function until opened.
struct Gate {
  std::latch latch{1};
  void block(CudaStream& stream) {
    BRAID_CUDA_CHECK(cudaLaunchHostFunc(
        stream.native(), [](void* self) { static_cast<Gate*>(self)->latch.wait(); }, this));
  }
  void open() { latch.count_down(); }
};

std::vector<trace::Record> records_on(trace::Track track) {
  std::vector<trace::Record> out;
  for (const trace::Record& r : trace::snapshot().records) {
    if (r.track == track.id) out.push_back(r);
  }
  return out;
}

TEST_F(CudaTimelineTest, SpanAroundAMemsetLandsOnItsTrackInsideTheHostWindow) {
  CudaStream stream(0);
  CudaTimeline timeline(stream, "gpu-test/memset");
  EXPECT_EQ(timeline.track(), trace::track("gpu-test/memset"));
  DeviceBuffer buffer;

  const std::int64_t host_before = trace::now_ns();
  const std::uint64_t token = timeline.begin(trace::Category::compute, "memset", buffer.bytes);
  EXPECT_NE(token, 0u);
  buffer.fill(stream, 0x5a);
  timeline.end(token);
  timeline.flush(deadline_after(10s));
  const std::int64_t host_after = trace::now_ns();

  const std::vector<trace::Record> records = records_on(timeline.track());
  ASSERT_EQ(records.size(), 1u);
  const trace::Record& span = records[0];
  EXPECT_EQ(span.kind, trace::RecordKind::async_span);
  EXPECT_EQ(span.category, trace::Category::compute);
  EXPECT_EQ(std::string_view(span.name), "memset");
  EXPECT_EQ(span.bytes, buffer.bytes);
  EXPECT_LT(span.begin_ns, span.end_ns);
  // The GPU ran the memset after begin() was called and before flush() saw it finish;
  // converted times may be off by the calibration error and the timer's resolution.
  const std::int64_t slack = timeline.calibration_error_ns() + 1000;
  EXPECT_GE(span.begin_ns, host_before - slack);
  EXPECT_LE(span.end_ns, host_after + slack);
}

TEST_F(CudaTimelineTest, NestedScopesKeepNesting) {
  CudaStream stream(0);
  CudaTimeline timeline(stream, "gpu-test/nested");
  DeviceBuffer buffer;
  {
    CudaTimeline::Scope outer(timeline, trace::Category::step, "outer");
    buffer.fill(stream, 1);
    {
      CudaTimeline::Scope inner(timeline, trace::Category::step, "inner");
      buffer.fill(stream, 2);
    }
    buffer.fill(stream, 3);
  }
  timeline.flush(deadline_after(10s));

  const std::vector<trace::Record> records = records_on(timeline.track());
  ASSERT_EQ(records.size(), 2u);
  const trace::Record& outer = records[0];  // snapshot order: begin time, longer first
  const trace::Record& inner = records[1];
  EXPECT_EQ(std::string_view(outer.name), "outer");
  EXPECT_EQ(std::string_view(inner.name), "inner");
  // A memset separates each pair of boundaries, so nesting is strict.
  EXPECT_LT(outer.begin_ns, inner.begin_ns);
  EXPECT_LT(inner.begin_ns, inner.end_ns);
  EXPECT_LT(inner.end_ns, outer.end_ns);
}

TEST_F(CudaTimelineTest, TracingOffRecordsNothing) {
  CudaStream stream(0);
  CudaTimeline timeline(stream, "gpu-test/off");
  DeviceBuffer buffer;
  trace::set_enabled(false);
  const std::uint64_t token = timeline.begin(trace::Category::compute, "memset");
  EXPECT_EQ(token, 0u);
  buffer.fill(stream, 7);
  EXPECT_NO_THROW(timeline.end(token));
  {
    CudaTimeline::Scope scope(timeline, trace::Category::compute, "scoped");
    buffer.fill(stream, 8);
  }
  timeline.flush(deadline_after(10s));
  EXPECT_EQ(timeline.collect(), 0u);
  EXPECT_TRUE(records_on(timeline.track()).empty());
}

TEST_F(CudaTimelineTest, CollectDoesNotWaitAndFlushTimesOutWhileTheStreamIsHeld) {
  CudaStream stream(0);
  CudaTimeline timeline(stream, "gpu-test/held");
  DeviceBuffer buffer;
  Gate gate;
  gate.block(stream);
  const std::uint64_t token = timeline.begin(trace::Category::compute, "held");
  buffer.fill(stream, 1);
  timeline.end(token);

  EXPECT_EQ(timeline.collect(), 0u);
  try {
    timeline.flush(deadline_after(20ms));
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
  EXPECT_TRUE(records_on(timeline.track()).empty());

  gate.open();
  timeline.flush(deadline_after(10s));
  EXPECT_EQ(records_on(timeline.track()).size(), 1u);
  EXPECT_EQ(timeline.collect(), 0u);  // recorded once
}

TEST_F(CudaTimelineTest, TraceWriteHandsInFinishedSpansThroughItsHook) {
  CudaStream stream(0);
  CudaTimeline timeline(stream, "gpu-test/write-hook");
  DeviceBuffer buffer;
  const std::uint64_t token = timeline.begin(trace::Category::comm, "copy");
  buffer.fill(stream, 1);
  timeline.end(token);
  stream.synchronize(deadline_after(10s));

  (void)trace::write();  // no output set: writes no file, but runs the hooks
  EXPECT_EQ(records_on(timeline.track()).size(), 1u);
}

TEST_F(CudaTimelineTest, ManySpansAreAllRecordedInStreamOrder) {
  CudaStream stream(0);
  CudaTimeline timeline(stream, "gpu-test/many");
  DeviceBuffer buffer(1 << 20);
  constexpr int kSpans = 200;  // past end()'s own collection backlog, and reusing events
  for (int i = 0; i < kSpans; ++i) {
    CudaTimeline::Scope span(timeline, trace::Category::compute, "fill");
    buffer.fill(stream, i);
  }
  timeline.flush(deadline_after(10s));

  const std::vector<trace::Record> records = records_on(timeline.track());
  ASSERT_EQ(records.size(), static_cast<std::size_t>(kSpans));
  // One span's end and the next one's begin are recorded back to back: they may meet,
  // to within the timer's resolution, but never overlap by more.
  for (std::size_t i = 1; i < records.size(); ++i) {
    EXPECT_LT(records[i - 1].begin_ns, records[i].begin_ns) << "span " << i;
    EXPECT_LE(records[i - 1].end_ns, records[i].begin_ns + 1000) << "span " << i;
  }
}

TEST_F(CudaTimelineTest, SpanBegunOnOneThreadEndsOnAnother) {
  CudaStream stream(0);
  CudaTimeline timeline(stream, "gpu-test/threads");
  DeviceBuffer buffer;
  const std::uint64_t token = timeline.begin(trace::Category::bucket, "bucket");
  buffer.fill(stream, 1);
  std::thread([&] { timeline.end(token); }).join();
  timeline.flush(deadline_after(10s));
  ASSERT_EQ(records_on(timeline.track()).size(), 1u);
}

TEST_F(CudaTimelineTest, EndingAnUnknownOrEndedTokenIsAnInvariantError) {
  CudaStream stream(0);
  CudaTimeline timeline(stream, "gpu-test/tokens");
  EXPECT_THROW(timeline.end(12345), InvariantError);
  const std::uint64_t token = timeline.begin(trace::Category::user, "once");
  timeline.end(token);
  EXPECT_THROW(timeline.end(token), InvariantError);
}

}  // namespace
}  // namespace braid
