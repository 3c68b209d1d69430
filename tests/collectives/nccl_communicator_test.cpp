// NcclCommunicator (nccl_communicator.hpp) on a one-rank communicator, which is what one
// GPU allows: every operation against its one-rank meaning (reductions and movements are
// copies), in place and out of place, every dtype and reduce op; split; the argument
// errors; route_cuda_to; and a trace in which the communication stream's GPU span
// overlaps a compute kernel on another stream. GPU-labelled: skipped without a device.
#include <cstring>
#include <numeric>

#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>
#include <braid/collectives/nccl_communicator.hpp>
#include <braid/core/cuda_error.hpp>
#include <braid/trace/cuda_timeline.hpp>
#include <braid/trace/recorder.hpp>

#include "../support/cuda_device.hpp"
#include "../support/expect_error.hpp"
#include "../support/rank_threads.hpp"
#include "../support/spin_kernel.hpp"
#include "typed_values.hpp"

namespace braid::collectives {
namespace {

using testing::TypedVector;
using namespace std::chrono_literals;

// Device memory holding a TypedVector's elements.
class DeviceVector {
 public:
  DeviceVector(DType dtype, std::size_t count) : dtype_(dtype), count_(count) {
    BRAID_CUDA_CHECK(cudaMalloc(&data_, std::max<std::size_t>(1, count * dtype_size(dtype))));
  }
  explicit DeviceVector(TypedVector& host) : DeviceVector(host.dtype(), host.count()) {
    upload(host);
  }
  ~DeviceVector() { (void)cudaFree(data_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;

  Buffer buffer() const { return Buffer(data_, count_, dtype_, MemoryKind::cuda, 0); }
  void upload(TypedVector& host) {
    BRAID_CUDA_CHECK(cudaMemcpy(data_, host.buffer().data(), host.buffer().size_bytes(),
                                cudaMemcpyHostToDevice));
  }
  TypedVector download() const {
    TypedVector host(dtype_, count_);
    BRAID_CUDA_CHECK(cudaMemcpy(host.buffer().data(), data_, host.buffer().size_bytes(),
                                cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  DType dtype_;
  std::size_t count_;
  void* data_ = nullptr;
};

TypedVector counting(DType dtype, std::size_t count, int offset = 0) {
  TypedVector v(dtype, count);
  for (std::size_t i = 0; i < count; ++i)
    v.set(i, static_cast<double>((static_cast<int>(i) + offset) % 100));
  return v;
}

void expect_same(const TypedVector& got, const TypedVector& expected, const std::string& what) {
  ASSERT_EQ(got.count(), expected.count()) << what;
  for (std::size_t i = 0; i < got.count(); ++i) {
    if (got.get(i) != expected.get(i)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got.get(i) << ", expected "
                    << expected.get(i);
      return;
    }
  }
}

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!braid::testing::has_cuda_device()) GTEST_SKIP() << "no CUDA device";
  }
  // Runs `body` with a one-rank NCCL communicator on device 0.
  template <class Body>
  void with_nccl(Body body) {
    braid::testing::run_ranks(1, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
      auto nccl = co_await NcclCommunicator::create(*comm, 0, {.timeout = 60s});
      EXPECT_EQ(nccl->rank(), 0);
      EXPECT_EQ(nccl->size(), 1);
      co_await body(comm, nccl);
    });
  }
};

constexpr DType kDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                             DType::i32, DType::i64, DType::u8};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max,
                             ReduceOp::prod};

TEST_F(NcclCommunicatorTest, ReductionsOfOneRankGiveItsInputForEveryDtypeAndOp) {
  with_nccl([](std::shared_ptr<Communicator>,
               std::shared_ptr<NcclCommunicator> nccl) -> asio::awaitable<void> {
    for (DType dtype : kDtypes) {
      for (ReduceOp op : kOps) {
        for (std::size_t count :
             {std::size_t{0}, std::size_t{1}, std::size_t{1031}, std::size_t{1} << 20}) {
          const std::string what =
              fmt::format("{} {} count {}", to_string(dtype), to_string(op), count);
          TypedVector values = counting(dtype, count);
          DeviceVector input(values);
          DeviceVector output(dtype, count);
          co_await nccl->all_reduce(input.buffer(), output.buffer(), op);
          expect_same(output.download(), values, "all_reduce " + what);
          co_await nccl->all_reduce(input.buffer(), op);
          expect_same(input.download(), values, "in-place all_reduce " + what);
          DeviceVector reduced(dtype, count);
          co_await nccl->reduce(input.buffer(), reduced.buffer(), op, 0);
          expect_same(reduced.download(), values, "reduce " + what);
          DeviceVector scattered(dtype, count);
          co_await nccl->reduce_scatter(input.buffer(), scattered.buffer(), op);
          expect_same(scattered.download(), values, "reduce_scatter " + what);
        }
      }
    }
  });
}

TEST_F(NcclCommunicatorTest, DataMovementOfOneRankCopiesInPlaceAndOutOfPlace) {
  with_nccl([](std::shared_ptr<Communicator>,
               std::shared_ptr<NcclCommunicator> nccl) -> asio::awaitable<void> {
    for (DType dtype : {DType::f32, DType::i64, DType::u8}) {
      const std::size_t count = 4099;
      TypedVector values = counting(dtype, count, 7);
      DeviceVector input(values);
      auto moved = [&](auto operation, const char* name) -> asio::awaitable<void> {
        DeviceVector output(dtype, count);
        co_await operation(output.buffer());
        expect_same(output.download(), values, fmt::format("{} {}", name, to_string(dtype)));
      };
      co_await moved([&](Buffer out) { return nccl->all_gather(input.buffer(), out); },
                     "all_gather");
      const std::vector<std::size_t> counts{count};
      co_await moved([&](Buffer out) { return nccl->all_gather_v(input.buffer(), out, counts); },
                     "all_gather_v");
      co_await moved([&](Buffer out) { return nccl->gather(input.buffer(), out, 0); }, "gather");
      co_await moved([&](Buffer out) { return nccl->scatter(input.buffer(), out, 0); }, "scatter");
      co_await moved([&](Buffer out) { return nccl->all_to_all(input.buffer(), out); },
                     "all_to_all");
      co_await moved(
          [&](Buffer out) { return nccl->all_to_all_v(input.buffer(), counts, out, counts); },
          "all_to_all_v");
      co_await nccl->broadcast(input.buffer(), 0);
      expect_same(input.download(), values, "broadcast");
      co_await nccl->all_to_all(input.buffer(), input.buffer());
      expect_same(input.download(), values, "in-place all_to_all");
      co_await nccl->barrier();
    }
  });
}

// In place as NCCL defines it: reduce_scatter's result and all_gather's contribution are
// the rank's block of the buffer, which on one rank is the whole of it.
TEST_F(NcclCommunicatorTest, InPlaceFormsOfOneRankLeaveTheBufferAsItWas) {
  with_nccl([](std::shared_ptr<Communicator>,
               std::shared_ptr<NcclCommunicator> nccl) -> asio::awaitable<void> {
    for (DType dtype : {DType::f32, DType::i64, DType::u8}) {
      TypedVector values = counting(dtype, 4099, 3);
      DeviceVector data(values);
      const std::string what = fmt::format(" {}", to_string(dtype));
      co_await nccl->reduce_scatter(data.buffer(), ReduceOp::sum);
      expect_same(data.download(), values, "in-place reduce_scatter" + what);
      co_await nccl->reduce(data.buffer(), ReduceOp::max, 0);
      expect_same(data.download(), values, "in-place reduce" + what);
      co_await nccl->all_gather(data.buffer());
      expect_same(data.download(), values, "in-place all_gather" + what);
      co_await nccl->all_to_all(data.buffer());
      expect_same(data.download(), values, "in-place all_to_all" + what);
    }
  });
}

// The detail of the invalid_argument error `call` throws.
template <class Call>
std::string refusal(Call call) {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    return e.detail();
  }
  ADD_FAILURE() << "the call was accepted";
  return {};
}

// Both communicators check a call with the same checks (call_checks_test.cpp has them
// all, on two ranks): the NCCL one refuses what the Communicator refuses, in its words.
TEST_F(NcclCommunicatorTest, PartialOverlapsAreRefusedInTheCommunicatorsWords) {
  with_nccl([](std::shared_ptr<Communicator> communicator,
               std::shared_ptr<NcclCommunicator> gpu) -> asio::awaitable<void> {
    // Locals for the lambdas below, not the coroutine's parameters (GCC 12).
    const std::shared_ptr<Communicator> comm = communicator;
    const std::shared_ptr<NcclCommunicator> nccl = gpu;
    DeviceVector device(DType::f32, 8);
    const Buffer whole = device.buffer();
    const std::string ours = refusal(
        [&] { (void)comm->all_reduce(whole.slice(0, 4), whole.slice(2, 4), ReduceOp::sum); });
    const std::string theirs = refusal(
        [&] { (void)nccl->all_reduce(whole.slice(0, 4), whole.slice(2, 4), ReduceOp::sum); });
    EXPECT_THAT(theirs, ::testing::HasSubstr("overlap without being the same memory"));
    EXPECT_EQ(theirs, ours);
    EXPECT_EQ(refusal([&] { (void)nccl->all_gather(whole.slice(1, 4), whole.slice(0, 4)); }),
              refusal([&] { (void)comm->all_gather(whole.slice(1, 4), whole.slice(0, 4)); }));
    const std::vector<std::size_t> four{4};
    EXPECT_EQ(refusal([&] {
                (void)nccl->all_to_all_v(whole.slice(0, 4), four, whole.slice(2, 4), four);
              }),
              refusal([&] {
                (void)comm->all_to_all_v(whole.slice(0, 4), four, whole.slice(2, 4), four);
              }));
    // Still usable afterwards.
    co_await nccl->barrier();
  });
}

TEST_F(NcclCommunicatorTest, SplitGivesAWorkingCommunicatorOrNothingForANegativeColor) {
  with_nccl([](std::shared_ptr<Communicator>,
               std::shared_ptr<NcclCommunicator> nccl) -> asio::awaitable<void> {
    auto child = co_await nccl->split(3, 0);
    EXPECT_NE(child, nullptr);
    if (child == nullptr) co_return;
    EXPECT_EQ(child->size(), 1);
    EXPECT_EQ(child->rank(), 0);
    TypedVector values = counting(DType::f32, 257);
    DeviceVector data(values);
    co_await child->all_reduce(data.buffer(), ReduceOp::max);
    expect_same(data.download(), values, "all_reduce on the split communicator");
    EXPECT_EQ(co_await nccl->split(-1, 0), nullptr);
  });
}

TEST_F(NcclCommunicatorTest, HostBuffersAndMismatchedSizesAreRejectedAtTheCall) {
  with_nccl([](std::shared_ptr<Communicator>,
               std::shared_ptr<NcclCommunicator> nccl) -> asio::awaitable<void> {
    std::vector<float> host(8);
    DeviceVector device(DType::f32, 8);
    DeviceVector shorter(DType::f32, 7);
    braid::testing::expect_invalid_argument(
        [&] { (void)nccl->all_reduce(Buffer(host), ReduceOp::sum); }, "host memory");
    braid::testing::expect_invalid_argument(
        [&] { (void)nccl->all_reduce(device.buffer(), shorter.buffer(), ReduceOp::sum); },
        "input has 8 elements and output 7");
    braid::testing::expect_invalid_argument([&] { (void)nccl->broadcast(device.buffer(), 1); },
                                            "root 1 is outside");
    // Still usable afterwards.
    co_await nccl->barrier();
  });
}

TEST_F(NcclCommunicatorTest, RoutedCommunicatorRunsCudaCallsOnNccl) {
  with_nccl([](std::shared_ptr<Communicator> comm,
               std::shared_ptr<NcclCommunicator> nccl) -> asio::awaitable<void> {
    comm->route_cuda_to(nccl);
    TypedVector values = counting(DType::f32, 1 << 16);
    DeviceVector data(values);
    co_await comm->all_reduce(data.buffer(), ReduceOp::sum);
    expect_same(data.download(), values, "routed all_reduce");
    comm->route_cuda_to(nullptr);
    co_await comm->all_reduce(data.buffer(), ReduceOp::sum);  // staged through host memory
    expect_same(data.download(), values, "staged all_reduce");
  });
}

TEST_F(NcclCommunicatorTest, TheCommunicationStreamsGpuSpanOverlapsAComputeKernelInTheTrace) {
  trace::set_enabled(true);
  trace::clear();
  std::vector<trace::Record> records;
  trace::Track compute_track{};
  braid::testing::run_ranks(1, [&](std::shared_ptr<Communicator> comm) -> asio::awaitable<void> {
    CudaStream compute(0);
    auto nccl = co_await NcclCommunicator::create(
        *comm, 0, {.timeout = 60s, .compute_stream = compute.native()});
    braid::testing::SpinKernel kernel;
    // 1 GiB out of place: a one-rank all-reduce is a device copy of ~0.5 ms, long enough
    // that the kernel launched just after it starts is still running beside it.
    DeviceVector gradients(DType::f32, std::size_t{256} << 20);
    DeviceVector reduced(DType::f32, std::size_t{256} << 20);
    {
      CudaTimeline timeline(compute, "test compute (gpu)");
      compute_track = timeline.track();
      // Started first, so it waits for nothing on the compute stream (contract point 4);
      // the kernel is enqueued after it and runs beside it.
      auto reducing = nccl->all_reduce(gradients.buffer(), reduced.buffer(), ReduceOp::sum);
      auto running = comm->runtime().spawn(std::move(reducing));
      // Let it start: it enqueues, then suspends polling for completion.
      for (int i = 0; i < 3; ++i)
        co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
      {
        CudaTimeline::Scope span(timeline, trace::Category::compute, "spin");
        kernel.launch(compute.native(), 40'000'000);  // ~20-30 ms
      }
      while (!running.ready())
        co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
      running.get();
      timeline.flush(deadline_after(10s));
    }
    nccl.reset();  // its GPU timeline records its spans
    records = trace::snapshot().records;
  });
  trace::set_enabled(false);
  const trace::Track nccl_gpu = trace::track("nccl device 0 (gpu)");
  const trace::Record* compute_span = nullptr;
  const trace::Record* comm_span = nullptr;
  for (const trace::Record& r : records) {
    if (r.track == compute_track.id && std::string_view(r.name) == "spin") compute_span = &r;
    if (r.track == nccl_gpu.id && std::string_view(r.name) == "all_reduce") comm_span = &r;
  }
  ASSERT_NE(compute_span, nullptr);
  ASSERT_NE(comm_span, nullptr);
  EXPECT_LT(comm_span->begin_ns, compute_span->end_ns);
  EXPECT_GT(comm_span->end_ns, compute_span->begin_ns)
      << "the all-reduce did not run beside the kernel";
  trace::clear();
}

}  // namespace
}  // namespace braid::collectives
