// The reducer with buckets in CUDA memory (dp::cuda_bucket_device), on a GPU. Gradients
// are produced as backward produces them: a kernel runs (a spin kernel standing in for the
// layer's backward), then the gradient is written on the same stream, and the hook fires
// when that work is enqueued, long before it has run. GPU-labelled: skipped without a
// CUDA device.
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <braid/collectives/communicator.hpp>
#include <braid/collectives/nccl_communicator.hpp>
#include <braid/collectives/reduce_kernels.hpp>
#include <braid/core/cuda_error.hpp>
#include <braid/core/cuda_stream.hpp>
#include <braid/dp/bucket_device.hpp>
#include <braid/dp/comm_hook.hpp>
#include <braid/dp/reducer.hpp>
#include <braid/trace/cuda_timeline.hpp>
#include <braid/trace/recorder.hpp>

#include "../support/cuda_device.hpp"
#include "../support/rank_threads.hpp"
#include "../support/spin_kernel.hpp"

namespace braid::dp {
namespace {

using namespace std::chrono_literals;
using collectives::Communicator;
using collectives::NcclCommunicator;

constexpr std::uint64_t kLayerCycles = 20'000'000;  // ~10-15 ms of "backward" per layer
constexpr trace::Name kLayerName("layer");

std::vector<ParameterSpec> model() {
  return {ParameterSpec{.name = "w1", .count = 4096, .memory = MemoryKind::cuda, .device = 0},
          ParameterSpec{.name = "b1", .count = 64, .memory = MemoryKind::cuda, .device = 0},
          ParameterSpec{.name = "w2", .count = 1 << 20, .memory = MemoryKind::cuda, .device = 0}};
}

float gradient_value(int rank, std::size_t p, std::size_t i, int step) {
  return std::sin(static_cast<float>(1 + rank * 7 + static_cast<int>(p) * 13 +
                                     static_cast<int>(i % 1000) * 3 + step * 17));
}

// Gradients in device memory, written from pinned host memory on the compute stream.
class CudaGradients final : public GradientAccess {
 public:
  explicit CudaGradients(const std::vector<ParameterSpec>& specs) {
    for (const ParameterSpec& spec : specs) {
      void* device = nullptr;
      void* host = nullptr;
      BRAID_CUDA_CHECK(cudaMalloc(&device, spec.count * sizeof(float)));
      BRAID_CUDA_CHECK(cudaMemset(device, 0, spec.count * sizeof(float)));
      BRAID_CUDA_CHECK(cudaMallocHost(&host, spec.count * sizeof(float)));
      device_.push_back(static_cast<float*>(device));
      pinned_.push_back(static_cast<float*>(host));
      counts_.push_back(spec.count);
    }
    bound_.resize(specs.size());
    owners_.resize(specs.size());
  }
  ~CudaGradients() override {
    for (float* p : device_) (void)cudaFree(p);
    for (float* p : pinned_) (void)cudaFreeHost(p);
  }
  std::optional<Buffer> gradient(std::size_t p, bool) override {
    if (bound_[p]) return *bound_[p];
    return Buffer(device_[p], counts_[p], DType::f32, MemoryKind::cuda, 0);
  }
  bool bind_gradient(std::size_t p, Buffer slot, std::shared_ptr<const void> owner) override {
    bound_[p] = slot;
    owners_[p] = std::move(owner);
    return true;
  }
  // The layer's backward (a spin kernel), then its gradient, both on `stream`: enqueued at
  // once, run later. The pinned source is rewritten only after the stream has drained.
  void produce(std::size_t p, int rank, int step, cudaStream_t stream, testing::SpinKernel& layer) {
    for (std::size_t i = 0; i < counts_[p]; ++i) pinned_[p][i] = gradient_value(rank, p, i, step);
    layer.launch(stream, kLayerCycles);
    const Buffer g = *gradient(p, true);
    BRAID_CUDA_CHECK(
        cudaMemcpyAsync(g.data(), pinned_[p], g.size_bytes(), cudaMemcpyHostToDevice, stream));
  }
  std::vector<float> read(std::size_t p, cudaStream_t stream) {
    BRAID_CUDA_CHECK(cudaStreamSynchronize(stream));
    const Buffer g = *gradient(p, false);
    std::vector<float> out(g.count());
    BRAID_CUDA_CHECK(cudaMemcpy(out.data(), g.data(), g.size_bytes(), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  std::vector<float*> device_;
  std::vector<float*> pinned_;
  std::vector<std::size_t> counts_;
  std::vector<std::optional<Buffer>> bound_;
  std::vector<std::shared_ptr<const void>> owners_;
};

class CudaReducer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!braid::testing::has_cuda_device()) GTEST_SKIP() << "no CUDA device";
  }
};

// One step: backward layer by layer (hooks fire at enqueue), then the optimizer's kernel
// already queued, then finalize. Returns whether finalize came back while the compute
// stream was still busy (the write-back queued behind the optimizer, not done).
bool step(Reducer& reducer, CudaGradients& grads, int rank, int step_index, CudaStream& compute,
          testing::SpinKernel& layer, CudaTimeline* timeline) {
  reducer.prepare_for_backward();
  for (std::size_t p = 3; p-- > 0;) {
    std::optional<CudaTimeline::Scope> span;
    if (timeline != nullptr) span.emplace(*timeline, trace::Category::compute, kLayerName);
    grads.produce(p, rank, step_index, compute.native(), layer);
    span.reset();
    reducer.mark_ready(p);
  }
  layer.launch(compute.native(), 4 * kLayerCycles);  // the optimizer
  reducer.finalize();
  return cudaStreamQuery(compute.native()) == cudaErrorNotReady;
}

TEST_F(CudaReducer, OneRankOnNcclReducesEachBucketBesideTheNextLayersKernel) {
  trace::set_enabled(true);
  trace::clear();
  std::vector<trace::Record> records;
  trace::Track compute_track{};
  const auto errors =
      braid::testing::run_blocking_ranks(1, [&](int rank, std::shared_ptr<Communicator> comm) {
        CudaStream compute(0);
        comm->route_cuda_to(
            comm->launch(NcclCommunicator::create(*comm, 0, {.timeout = 60s})).get());
        testing::SpinKernel layer;
        CudaGradients grads(model());
        auto device =
            cuda_bucket_device(0, [&compute] { return static_cast<void*>(compute.native()); });
        {
          CudaTimeline timeline(compute, "test compute (gpu)");
          compute_track = timeline.track();
          Reducer reducer(comm, model(), grads,
                          {.limits = {.first_bucket_bytes = 1, .bucket_cap_bytes = 1},
                           .rebuild_buckets = false,
                           .device = device});
          for (int s = 0; s < 2; ++s) {
            EXPECT_TRUE(step(reducer, grads, rank, s, compute, layer, &timeline))
                << "finalize waited for the compute stream";
            for (std::size_t p = 0; p < 3; ++p) {
              const std::vector<float> g = grads.read(p, compute.native());
              for (std::size_t i = 0; i < g.size(); i += 97) {
                ASSERT_EQ(g[i], gradient_value(rank, p, i, s))
                    << "step " << s << " parameter " << p;
              }
            }
          }
          timeline.flush(deadline_after(10s));
        }
        comm->route_cuda_to(nullptr);  // the NCCL communicator goes: its GPU spans are recorded
        records = trace::snapshot().records;
      });
  trace::set_enabled(false);
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  // Bucket 0 is w2's (the first gradient backward makes): its all-reduce runs on the GPU
  // while the next layer's kernel does.
  const trace::Track nccl_gpu = trace::track("nccl device 0 (gpu)");
  std::vector<const trace::Record*> layers;
  const trace::Record* first_reduction = nullptr;
  for (const trace::Record& r : records) {
    if (r.track == compute_track.id && std::string_view(r.name) == "layer") layers.push_back(&r);
    if (r.track == nccl_gpu.id && std::string_view(r.name) == "all_reduce" &&
        first_reduction == nullptr)
      first_reduction = &r;
  }
  ASSERT_GE(layers.size(), 2u);
  ASSERT_NE(first_reduction, nullptr);
  EXPECT_GE(first_reduction->begin_ns, layers[0]->end_ns - 1'000'000)
      << "bucket 0 was reduced before its layer had run";
  EXPECT_LT(first_reduction->begin_ns, layers[1]->end_ns)
      << "bucket 0 waited for the next layer's kernel";
  trace::clear();
}

TEST_F(CudaReducer, TwoRanksSharingTheGpuAverageThroughStagingInStreamOrder) {
  const auto errors = braid::testing::run_blocking_ranks(2, [](int rank,
                                                               std::shared_ptr<Communicator> comm) {
    CudaStream compute(0);
    testing::SpinKernel layer;
    CudaGradients grads(model());
    auto device =
        cuda_bucket_device(0, [&compute] { return static_cast<void*>(compute.native()); });
    Reducer reducer(comm, model(), grads,
                    {.limits = {.first_bucket_bytes = 1, .bucket_cap_bytes = 1}, .device = device});
    for (int s = 0; s < 3; ++s) {
      (void)step(reducer, grads, rank, s, compute, layer, nullptr);
      for (std::size_t p = 0; p < 3; ++p) {
        const std::vector<float> g = grads.read(p, compute.native());
        for (std::size_t i = 0; i < g.size(); i += 97) {
          ASSERT_NEAR(g[i], (gradient_value(0, p, i, s) + gradient_value(1, p, i, s)) / 2, 1e-6)
              << "step " << s << " parameter " << p;
        }
      }
    }
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

TEST_F(CudaReducer, TheCompressHookConvertsOnTheDevice) {
  const auto errors = braid::testing::run_blocking_ranks(1, [](int rank,
                                                               std::shared_ptr<Communicator> comm) {
    CudaStream compute(0);
    comm->route_cuda_to(comm->launch(NcclCommunicator::create(*comm, 0, {.timeout = 60s})).get());
    testing::SpinKernel layer;
    CudaGradients grads(model());
    auto device =
        cuda_bucket_device(0, [&compute] { return static_cast<void*>(compute.native()); });
    Reducer reducer(comm, model(), grads, {.device = device});
    reducer.set_comm_hook(compress_hook(DType::f16));
    (void)step(reducer, grads, rank, 0, compute, layer, nullptr);
    for (std::size_t p = 0; p < 3; ++p) {
      const std::vector<float> g = grads.read(p, compute.native());
      for (std::size_t i = 0; i < g.size(); i += 97) {
        const float value = gradient_value(rank, p, i, 0);
        ASSERT_EQ(g[i], collectives::f16_to_f32(collectives::f32_to_f16(value))) << p;
      }
    }
    comm->route_cuda_to(nullptr);
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace braid::dp
