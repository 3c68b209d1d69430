// A BucketDevice on the CPU (bucket_device.hpp): host streams for the producer ("the
// stream backward computes on") and the reduction stream, and host memory labelled as
// CUDA device `device`'s. With a communicator that stages CUDA-labelled buffers through a
// host copy engine (staging_engine_override.hpp), the reducer's device path runs end to
// end on a machine without a GPU, in the same stream order as on one: a test writes
// gradients as work on producer() (as backward's kernels would, after the hook has
// fired) and reads results after synchronising it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

#include <braid/collectives/reduce_kernels.hpp>
#include <braid/core/host_stream.hpp>
#include <braid/dp/bucket_device.hpp>

namespace braid::testing {

class HostBucketDevice final : public dp::BucketDevice {
 public:
  explicit HostBucketDevice(int device = 0, int producers = 1) : device_(device) {
    for (int p = 0; p < producers; ++p)
      producers_.push_back(std::make_shared<HostStream>("producer"));
  }

  int device() const noexcept override { return device_; }

  std::shared_ptr<std::byte[]> allocate(std::size_t bytes) override {
    auto* memory = static_cast<std::byte*>(std::malloc(bytes == 0 ? 1 : bytes));
    if (memory == nullptr) throw std::bad_alloc();
    // Not zeroed, as cudaMalloc's is not: 0xff bytes are NaNs in every float dtype, so a
    // reducer that read memory it never wrote would show it.
    std::memset(memory, 0xff, bytes);
    // As cudaFree does, freeing waits for the work still queued on the device's streams.
    return std::shared_ptr<std::byte[]>(memory, [streams = all_streams()](std::byte* p) {
      for (const auto& s : streams) s->synchronize(deadline_after(std::chrono::seconds(20)));
      std::free(p);
    });
  }

  // The stream the "framework" computes on now: producer(p) after use_producer(p).
  Stream& producer() override { return *producers_[current_]; }
  HostStream& compute(int p = 0) { return *producers_[static_cast<std::size_t>(p)]; }
  void use_producer(int p) { current_ = static_cast<std::size_t>(p); }
  Stream& reduction_stream(std::size_t bucket) override {
    return *reductions_[bucket % reductions_.size()];
  }

  void convert(const Buffer& dst, const Buffer& src, double factor, Stream& stream) override {
    if (dst.count() != src.count()) throw std::invalid_argument("convert: counts differ");
    host(stream).enqueue([dst, src, factor] {
      for (std::size_t i = 0; i < src.count(); ++i) store(dst, i, load(src, i) * factor);
    });
  }

  void zero(const Buffer& dst, Stream& stream) override {
    host(stream).enqueue([dst] { std::memset(dst.data(), 0, dst.size_bytes()); });
  }

  // Waits for everything enqueued on every stream so far.
  void synchronize() {
    for (const auto& s : all_streams()) s->synchronize(deadline_after(std::chrono::seconds(20)));
  }

 private:
  static HostStream& host(Stream& stream) {
    auto* h = dynamic_cast<HostStream*>(&stream);
    if (h == nullptr) throw std::invalid_argument("HostBucketDevice: not a host stream");
    return *h;
  }
  static double load(const Buffer& b, std::size_t i) {
    const void* p = b.data();
    switch (b.dtype()) {
      case DType::f32:
        return static_cast<const float*>(p)[i];
      case DType::f64:
        return static_cast<const double*>(p)[i];
      case DType::f16:
        return collectives::f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
      case DType::bf16:
        return collectives::bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
      default:
        throw std::invalid_argument("HostBucketDevice: not a floating dtype");
    }
  }
  static void store(const Buffer& b, std::size_t i, double v) {
    void* p = b.data();
    switch (b.dtype()) {
      case DType::f32:
        static_cast<float*>(p)[i] = static_cast<float>(v);
        return;
      case DType::f64:
        static_cast<double*>(p)[i] = v;
        return;
      case DType::f16:
        static_cast<std::uint16_t*>(p)[i] = collectives::f32_to_f16(static_cast<float>(v));
        return;
      case DType::bf16:
        static_cast<std::uint16_t*>(p)[i] = collectives::f32_to_bf16(static_cast<float>(v));
        return;
      default:
        throw std::invalid_argument("HostBucketDevice: not a floating dtype");
    }
  }
  std::vector<std::shared_ptr<HostStream>> all_streams() const {
    std::vector<std::shared_ptr<HostStream>> all = producers_;
    all.insert(all.end(), reductions_.begin(), reductions_.end());
    return all;
  }

  int device_;
  std::vector<std::shared_ptr<HostStream>> producers_;
  std::size_t current_ = 0;
  std::vector<std::shared_ptr<HostStream>> reductions_ = {
      std::make_shared<HostStream>("reduction 0"), std::make_shared<HostStream>("reduction 1")};
};

}  // namespace braid::testing
