// The reducer with its buckets in device memory (Reducer::Options::device), on a machine
// without a GPU: a host stand-in for the device (host streams, memory labelled CUDA) and
// communicators that stage CUDA-labelled buffers through a host copy engine. Gradients are
// written as work on the producer stream after their hook has fired, as backward's kernels
// are, so a reducer that read them on the host at mark time, reduced before the stream
// got there, or wrote back before the reductions, would get other numbers. Each
// configuration (no_sync, unused parameters, bucket views, the compress hook, uneven
// shares, a rank that shadows) must end where the host reducer does.
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/dp/comm_hook.hpp>
#include <braid/dp/reducer.hpp>

#include "../support/host_bucket_device.hpp"
#include "../support/rank_threads.hpp"
#include "collectives/staging.hpp"
#include "collectives/staging_engine_override.hpp"

namespace braid::dp {
namespace {

using collectives::Communicator;
using testing::HostBucketDevice;

void stage_on_host(Communicator& comm) {
  collectives::detail::StagingEngineOverride::install(
      comm, [](int) -> std::unique_ptr<collectives::detail::CopyEngine> {
        return std::make_unique<collectives::detail::HostCopyEngine>();
      });
}

std::vector<ParameterSpec> model(MemoryKind memory, int device = 0) {
  const int where = memory == MemoryKind::cuda ? device : -1;
  return {
      ParameterSpec{.name = "w1", .count = 30, .memory = memory, .device = where, .shape = {6, 5}},
      ParameterSpec{.name = "b1", .count = 5, .memory = memory, .device = where, .shape = {5}},
      ParameterSpec{
          .name = "w2", .count = 1200, .memory = memory, .device = where, .shape = {40, 30}}};
}

float gradient_value(int rank, std::size_t p, std::size_t i, int step) {
  return std::sin(static_cast<float>(1 + rank * 7 + static_cast<int>(p) * 13 +
                                     static_cast<int>(i) * 3 + step * 17));
}

// A framework's gradients: host vectors (labelled CUDA for the device reducer), or views
// of bucket slots once bound (gradient_as_bucket_view). produce() writes one as backward
// would: at once on the host, as work on the device's current producer stream otherwise.
class Gradients final : public GradientAccess {
 public:
  Gradients(const std::vector<ParameterSpec>& specs, HostBucketDevice* device)
      : device_(device), values_(specs.size()), bound_(specs.size()), owners_(specs.size()) {
    for (std::size_t p = 0; p < specs.size(); ++p) values_[p].assign(specs[p].count, 0.0f);
  }
  std::optional<Buffer> gradient(std::size_t p, bool) override {
    if (bound_[p]) return *bound_[p];
    return device_ != nullptr
               ? Buffer(values_[p].data(), values_[p].size(), DType::f32, MemoryKind::cuda, 0)
               : Buffer(values_[p]);
  }
  bool bind_gradient(std::size_t p, Buffer slot, std::shared_ptr<const void> owner) override {
    bound_[p] = slot;
    owners_[p] = std::move(owner);
    return true;
  }
  void produce(std::size_t p, std::function<float(std::size_t)> value,
               std::chrono::milliseconds late = std::chrono::milliseconds(0)) {
    const Buffer g = *gradient(p, true);
    auto write = [g, value = std::move(value), late] {
      if (late.count() > 0) std::this_thread::sleep_for(late);
      auto* out = static_cast<float*>(g.data());
      for (std::size_t i = 0; i < g.count(); ++i) out[i] = value(i);
    };
    if (device_ != nullptr) {
      dynamic_cast<HostStream&>(device_->producer()).enqueue(std::move(write));
    } else {
      write();
    }
  }
  std::vector<float> read(std::size_t p) {
    if (device_ != nullptr) device_->synchronize();
    const Buffer g = *gradient(p, false);
    const auto* v = static_cast<const float*>(g.data());
    return {v, v + g.count()};
  }

 private:
  HostBucketDevice* device_;
  std::vector<std::vector<float>> values_;
  std::vector<std::optional<Buffer>> bound_;
  std::vector<std::shared_ptr<const void>> owners_;
};

std::shared_ptr<BucketDevice> borrow(HostBucketDevice& device) {
  return std::shared_ptr<BucketDevice>(&device, [](BucketDevice*) {});
}

void expect_passed(const std::vector<std::string>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(DeviceReducer, AveragesGradientsWrittenAfterTheirHooksAndWritesBackInStreamOrder) {
  expect_passed(testing::run_blocking_ranks(2, [](int rank, std::shared_ptr<Communicator> comm) {
    stage_on_host(*comm);
    HostBucketDevice device;
    Gradients grads(model(MemoryKind::cuda), &device);
    // One byte of limit: a bucket per parameter, each reduced while later ones are produced.
    // No rebuild: freeing the first buckets waits for the device's streams, as cudaFree
    // does, and this test holds the producer stream from the host.
    Reducer reducer(comm, model(MemoryKind::cuda), grads,
                    {.limits = {.first_bucket_bytes = 1, .bucket_cap_bytes = 1},
                     .rebuild_buckets = false,
                     .device = borrow(device)});
    for (int step = 0; step < 3; ++step) {
      reducer.prepare_for_backward();
      for (std::size_t p = 3; p-- > 0;) {
        // The hook fires as the kernel is enqueued; the values land 3 ms later.
        grads.produce(
            p, [=](std::size_t i) { return gradient_value(rank, p, i, step); },
            std::chrono::milliseconds(3));
        reducer.mark_ready(p);
      }
      // The optimizer's kernels, already queued behind backward, hold the stream.
      std::atomic<bool> release{false};
      device.compute().enqueue([&release] {
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      });
      reducer.finalize();
      // finalize returned with the write-back queued on the producer stream, not done.
      EXPECT_FALSE(device.producer().query());
      release = true;
      for (std::size_t p = 0; p < 3; ++p) {
        const std::vector<float> averaged = grads.read(p);
        for (std::size_t i = 0; i < averaged.size(); ++i) {
          const float expected =
              (gradient_value(0, p, i, step) + gradient_value(1, p, i, step)) / 2.0f;
          ASSERT_NEAR(averaged[i], expected, 1e-6) << "step " << step << " parameter " << p;
        }
      }
    }
  }));
}

TEST(DeviceReducer, WaitsForABucketsGradientsOnEveryStreamTheyCameOn) {
  expect_passed(testing::run_blocking_ranks(2, [](int rank, std::shared_ptr<Communicator> comm) {
    stage_on_host(*comm);
    HostBucketDevice device(0, /*producers=*/2);
    Gradients grads(model(MemoryKind::cuda), &device);
    // Default limits: one bucket for all three.
    Reducer reducer(comm, model(MemoryKind::cuda), grads, {.device = borrow(device)});
    ASSERT_EQ(reducer.bucket_count(), 1u);
    reducer.prepare_for_backward();
    for (std::size_t p = 3; p-- > 0;) {
      // w2 comes on a side stream and lands last, after the others' stream has finished.
      device.use_producer(p == 2 ? 1 : 0);
      grads.produce(
          p, [=](std::size_t i) { return gradient_value(rank, p, i, 0); },
          std::chrono::milliseconds(p == 2 ? 30 : 1));
      reducer.mark_ready(p);
    }
    device.use_producer(0);
    reducer.finalize();
    for (std::size_t p = 0; p < 3; ++p) {
      const std::vector<float> averaged = grads.read(p);
      for (std::size_t i = 0; i < averaged.size(); ++i) {
        ASSERT_NEAR(averaged[i], (gradient_value(0, p, i, 0) + gradient_value(1, p, i, 0)) / 2,
                    1e-6)
            << "parameter " << p;
      }
    }
  }));
}

// One configuration, run by the host reducer and by the device reducer on the same
// gradients: both must end with the same gradients on every rank.
struct Configuration {
  std::string name;
  Reducer::Options options;
  std::function<std::shared_ptr<CommHook>()> hook;  // null: the default all-reduce
  bool first_step_no_sync = false;
  bool rank1_leaves_b1_unused = false;
  bool rank1_shadows_last_step = false;
  bool uneven_shares = false;
};

std::vector<std::vector<float>> train(const Configuration& c, int rank,
                                      std::shared_ptr<Communicator> comm, bool on_device) {
  HostBucketDevice device;
  const MemoryKind memory = on_device ? MemoryKind::cuda : MemoryKind::host;
  Gradients grads(model(memory), on_device ? &device : nullptr);
  Reducer::Options options = c.options;
  if (on_device) options.device = borrow(device);
  Reducer reducer(comm, model(memory), grads, options);
  if (c.hook) reducer.set_comm_hook(c.hook());
  if (c.uneven_shares) reducer.set_batch_share(rank == 0 ? 0.25 : 0.75);
  for (int step = 0; step < 3; ++step) {
    if (c.rank1_shadows_last_step && rank == 1 && step == 2) {
      reducer.shadow_iteration(c.rank1_leaves_b1_unused);
      continue;
    }
    const bool sync = !(c.first_step_no_sync && step == 0);
    const bool leaves_b1 = c.rank1_leaves_b1_unused && rank == 1;
    std::optional<std::vector<std::size_t>> unused;
    if (c.rank1_leaves_b1_unused)
      unused = leaves_b1 ? std::vector<std::size_t>{1} : std::vector<std::size_t>{};
    reducer.prepare_for_backward(sync, unused);
    for (std::size_t p = 3; p-- > 0;) {
      if (leaves_b1 && p == 1) continue;
      grads.produce(
          p, [=](std::size_t i) { return gradient_value(rank, p, i, step); },
          std::chrono::milliseconds(on_device ? 1 : 0));
      reducer.mark_ready(p);
    }
    reducer.finalize();
  }
  std::vector<std::vector<float>> result;
  for (std::size_t p = 0; p < 3; ++p) result.push_back(grads.read(p));
  if (on_device) device.synchronize();
  return result;
}

TEST(DeviceReducer, EndsWhereTheHostReducerEndsInEveryConfiguration) {
  const Reducer::Options small = {.limits = {.first_bucket_bytes = 64, .bucket_cap_bytes = 256}};
  Reducer::Options views = small;
  views.gradient_as_bucket_view = true;
  const std::vector<Configuration> configurations = {
      {.name = "plain", .options = small},
      {.name = "no_sync first", .options = small, .first_step_no_sync = true},
      {.name = "unused b1 on rank 1", .options = small, .rank1_leaves_b1_unused = true},
      {.name = "bucket views", .options = views},
      {.name = "bucket views, unused b1", .options = views, .rank1_leaves_b1_unused = true},
      {.name = "compress f16", .options = small, .hook = [] { return compress_hook(DType::f16); }},
      {.name = "uneven shares", .options = small, .uneven_shares = true},
      {.name = "rank 1 shadows", .options = small, .rank1_shadows_last_step = true},
  };
  for (const Configuration& c : configurations) {
    expect_passed(testing::run_blocking_ranks(2, [&](int rank, std::shared_ptr<Communicator> comm) {
      stage_on_host(*comm);
      const auto on_host = train(c, rank, comm, false);
      const auto on_device = train(c, rank, comm, true);
      for (std::size_t p = 0; p < on_host.size(); ++p) {
        for (std::size_t i = 0; i < on_host[p].size(); ++i) {
          ASSERT_NEAR(on_device[p][i], on_host[p][i], 1e-6)
              << c.name << ": parameter " << p << " element " << i;
        }
      }
    }));
  }
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    return e.what();
  }
  return "";
}

TEST(DeviceReducer, RefusesMixedDevicesAMissingDeviceAndHostOnlyWork) {
  expect_passed(testing::run_blocking_ranks(1, [](int, std::shared_ptr<Communicator> comm) {
    stage_on_host(*comm);
    HostBucketDevice device;
    Gradients grads(model(MemoryKind::cuda), &device);

    std::vector<ParameterSpec> mixed = model(MemoryKind::cuda);
    mixed[2].memory = MemoryKind::host;
    mixed[2].device = -1;
    EXPECT_NE(error_of([&] { Reducer(comm, mixed, grads, {.device = borrow(device)}); })
                  .find("mixed devices: 'w2' (parameter 2) is on host memory but 'w1' "
                        "(parameter 0) is on CUDA device 0"),
              std::string::npos);
    std::vector<ParameterSpec> two_devices = model(MemoryKind::cuda);
    two_devices[1].device = 1;
    EXPECT_NE(error_of([&] {
                Reducer(comm, two_devices, grads, {.device = borrow(device)});
              }).find("'b1' (parameter 1) is on CUDA device 1"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                Reducer(comm, model(MemoryKind::cuda), grads);
              }).find("'w1' (parameter 0) is in CUDA memory: its buckets need a device"),
              std::string::npos);

    Reducer reducer(comm, model(MemoryKind::cuda), grads, {.device = borrow(device)});
    EXPECT_NE(error_of([&] {
                reducer.set_comm_hook(quantize_8bit_hook());
              }).find("the quantize_8bit comm hook reduces buckets in host memory"),
              std::string::npos);
    EXPECT_NE(error_of([&] { reducer.set_comm_hook(power_sgd_hook(1)); }).find("power_sgd"),
              std::string::npos);
    EXPECT_NE(error_of([&] { reducer.clip_grad_norm(1.0); }).find("clip_grad_norm_"),
              std::string::npos);
  }));
}

}  // namespace
}  // namespace braid::dp
