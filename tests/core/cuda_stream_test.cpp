// GPU suite: every test that needs a device skips itself when cudaGetDeviceCount finds
// none. Work is cudaMemsetAsync / cudaMemcpyAsync (braid compiles no kernels) and, where a
// test must hold a stream back, a host function that blocks on a latch.
#include <cstddef>
#include <cstdint>
#include <latch>
#include <thread>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <braid/core/cuda_error.hpp>
#include <braid/core/cuda_stream.hpp>
#include <braid/core/host_stream.hpp>
#include <braid/core/runtime.hpp>

#include "../support/cuda_device.hpp"

namespace braid {
namespace {

using namespace std::chrono_literals;

using braid::testing::has_cuda_device;

class CudaStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_cuda_device()) GTEST_SKIP() << "no CUDA device";
  }
};

// Device memory and pinned host memory of `bytes` each, freed at scope exit.
struct Buffers {
  explicit Buffers(std::size_t n) : bytes(n) {
    void* memory = nullptr;
    BRAID_CUDA_CHECK(cudaMalloc(&memory, bytes));
    device = static_cast<std::uint8_t*>(memory);
    BRAID_CUDA_CHECK(cudaMallocHost(&memory, bytes));
    host = static_cast<std::uint8_t*>(memory);
  }
  ~Buffers() {
    (void)cudaFree(device);
    (void)cudaFreeHost(host);
  }
  bool host_all(std::uint8_t value) const {
    for (std::size_t i = 0; i < bytes; ++i) {
      if (host[i] != value) return false;
    }
    return true;
  }
  std::size_t bytes;
  std::uint8_t* device = nullptr;
  std::uint8_t* host = nullptr;
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

asio::awaitable<std::thread::id> await_event(Event* event, Deadline deadline) {
  co_await wait(*event, deadline);
  co_return std::this_thread::get_id();
}

TEST(CudaError, CheckThrowsBraidErrorInTheCudaCategoryNamingTheCall) {
  try {
    BRAID_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(&e.code().category(), &cuda_category());
    EXPECT_EQ(e.code().value(), static_cast<int>(cudaErrorInvalidValue));
    EXPECT_EQ(e.code().message(),
              std::string(cudaGetErrorString(cudaErrorInvalidValue)) + " (cudaErrorInvalidValue)");
    EXPECT_NE(e.detail().find("cudaErrorInvalidValue at "), std::string::npos) << e.detail();
    EXPECT_NE(std::string(e.what()).find("[cuda:1]"), std::string::npos) << e.what();
  }
}

TEST_F(CudaStreamTest, WorkRunsInOrderAndTheEventCoversIt) {
  CudaStream stream(0);
  EXPECT_EQ(stream.kind(), StreamKind::cuda);
  Buffers buffers(1 << 20);
  BRAID_CUDA_CHECK(cudaMemsetAsync(buffers.device, 0x11, buffers.bytes, stream.native()));
  BRAID_CUDA_CHECK(cudaMemsetAsync(buffers.device, 0x5a, buffers.bytes, stream.native()));
  BRAID_CUDA_CHECK(cudaMemcpyAsync(buffers.host, buffers.device, buffers.bytes,
                                   cudaMemcpyDeviceToHost, stream.native()));
  auto event = stream.make_event();
  stream.record(*event);
  event->synchronize(deadline_after(10s));
  EXPECT_TRUE(event->query());
  EXPECT_TRUE(buffers.host_all(0x5a));
  stream.synchronize(deadline_after(10s));
  EXPECT_TRUE(stream.query());
}

TEST_F(CudaStreamTest, NeverRecordedEventIsComplete) {
  CudaStream stream(0);
  auto event = stream.make_event();
  EXPECT_TRUE(event->query());
  EXPECT_NO_THROW(event->synchronize(deadline_after(1s)));
}

TEST_F(CudaStreamTest, EventCompletesBeforeWorkEnqueuedAfterIt) {
  CudaStream stream(0);
  Gate gate;
  auto event = stream.make_event();
  stream.record(*event);
  gate.block(stream);
  event->synchronize(deadline_after(10s));
  EXPECT_FALSE(stream.query());
  gate.open();
  stream.synchronize(deadline_after(10s));
}

TEST_F(CudaStreamTest, WaitOrdersAnotherStreamsLaterWorkAfterTheEvent) {
  CudaStream producer(0), consumer(0);
  Gate gate;
  Buffers buffers(1 << 20);
  BRAID_CUDA_CHECK(cudaMemsetAsync(buffers.device, 0x00, buffers.bytes, producer.native()));
  producer.synchronize(deadline_after(10s));

  gate.block(producer);
  BRAID_CUDA_CHECK(cudaMemsetAsync(buffers.device, 0x7e, buffers.bytes, producer.native()));
  auto produced = producer.make_event();
  producer.record(*produced);
  consumer.wait(*produced);
  BRAID_CUDA_CHECK(cudaMemcpyAsync(buffers.host, buffers.device, buffers.bytes,
                                   cudaMemcpyDeviceToHost, consumer.native()));
  auto copied = consumer.make_event();
  consumer.record(*copied);

  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(copied->query());  // held back by the producer's gate
  gate.open();
  copied->synchronize(deadline_after(10s));
  EXPECT_TRUE(buffers.host_all(0x7e));
}

TEST_F(CudaStreamTest, SynchronizeTimesOutWhileTheStreamIsHeld) {
  CudaStream stream(0);
  Gate gate;
  gate.block(stream);
  auto event = stream.make_event();
  stream.record(*event);
  try {
    event->synchronize(deadline_after(20ms));
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
  EXPECT_THROW(stream.synchronize(deadline_after(20ms)), Error);
  gate.open();
  stream.synchronize(deadline_after(10s));
}

TEST_F(CudaStreamTest, AwaitResumesOnTheRuntimeThreadAfterTheCopy) {
  Runtime runtime;
  CudaStream stream(0);
  Gate gate;
  Buffers buffers(1 << 16);
  gate.block(stream);
  BRAID_CUDA_CHECK(cudaMemsetAsync(buffers.device, 0x33, buffers.bytes, stream.native()));
  BRAID_CUDA_CHECK(cudaMemcpyAsync(buffers.host, buffers.device, buffers.bytes,
                                   cudaMemcpyDeviceToHost, stream.native()));
  auto event = stream.make_event();
  stream.record(*event);

  Future<std::thread::id> resumed = runtime.spawn(await_event(event.get(), deadline_after(10s)));
  EXPECT_FALSE(resumed.wait_for(20ms));
  gate.open();
  EXPECT_EQ(resumed.get(), runtime.thread_id());
  EXPECT_TRUE(buffers.host_all(0x33));
}

TEST_F(CudaStreamTest, AwaitTimesOutAndTheLateHostFunctionIsHarmless) {
  Runtime runtime;
  CudaStream stream(0);
  Gate gate;
  gate.block(stream);
  auto event = stream.make_event();
  stream.record(*event);
  try {
    runtime.spawn(await_event(event.get(), deadline_after(20ms))).get();
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
  gate.open();
  stream.synchronize(deadline_after(10s));
  EXPECT_EQ(runtime.spawn(await_event(event.get(), deadline_after(10s))).get(),
            runtime.thread_id());
}

TEST_F(CudaStreamTest, DestroyedStreamStillFinishesItsWorkAndEvents) {
  Runtime runtime;
  Gate gate;
  auto event = std::make_unique<CudaEvent>(0);
  Future<std::thread::id> resumed;
  {
    CudaStream stream(0);
    gate.block(stream);
    stream.record(*event);
    resumed = runtime.spawn(await_event(event.get(), deadline_after(10s)));
  }
  EXPECT_FALSE(event->query());
  gate.open();
  EXPECT_EQ(resumed.get(), runtime.thread_id());
  EXPECT_TRUE(event->query());
}

TEST_F(CudaStreamTest, BorrowedStreamIsUsedButNotDestroyed) {
  cudaStream_t raw = nullptr;
  BRAID_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
  {
    CudaStream borrowed(BorrowedCudaStream{raw, 0});
    EXPECT_EQ(borrowed.native(), raw);
    auto event = borrowed.make_event();
    borrowed.record(*event);
    event->synchronize(deadline_after(10s));
  }
  EXPECT_EQ(cudaStreamQuery(raw), cudaSuccess);  // still a live stream
  BRAID_CUDA_CHECK(cudaStreamDestroy(raw));
}

TEST_F(CudaStreamTest, RefusesHostEvents) {
  CudaStream stream(0);
  HostEvent host;
  EXPECT_THROW(stream.record(host), InvariantError);
  EXPECT_THROW(stream.wait(host), InvariantError);
  HostStream host_stream;
  auto cuda_event = stream.make_event();
  EXPECT_THROW(host_stream.wait(*cuda_event), InvariantError);
}

}  // namespace
}  // namespace braid
