// cuda_bucket_device() (<braid/dp/bucket_device.hpp>): bucket memory from cudaMalloc, the
// reducer's streams, and the kernels of bucket_kernels.cu. In a build without CUDA it
// refuses with an error saying so.
#include <braid/build_config.hpp>
#include <braid/core/error.hpp>
#include <braid/dp/bucket_device.hpp>

#if BRAID_WITH_CUDA
#include <map>
#include <mutex>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <braid/core/cuda_error.hpp>
#include <braid/core/cuda_stream.hpp>
#include <braid/core/cuda_support.hpp>

#include "dp/bucket_kernels.hpp"
#endif

namespace braid::dp {

#if BRAID_WITH_CUDA
namespace {

detail::KernelType kernel_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return detail::KernelType::f32;
    case DType::f64:
      return detail::KernelType::f64;
    case DType::f16:
      return detail::KernelType::f16;
    case DType::bf16:
      return detail::KernelType::bf16;
    default:
      throw Error(Errc::invalid_argument,
                  fmt::format("bucket kernels take floating dtypes, not {}", to_string(dtype)),
                  {.operation = "ddp"});
  }
}

cudaStream_t native(Stream& stream) {
  auto* cuda = dynamic_cast<CudaStream*>(&stream);
  if (cuda == nullptr) {
    throw Error(Errc::invalid_argument,
                fmt::format("CUDA bucket work enqueued on a {} stream", to_string(stream.kind())),
                {.operation = "ddp"});
  }
  return cuda->native();
}

class CudaBucketDevice final : public BucketDevice {
 public:
  CudaBucketDevice(int device, std::function<void*()> current_stream)
      : device_(device),
        current_stream_(std::move(current_stream)),
        reduction_(make_reduction_streams(device)) {}

  int device() const noexcept override { return device_; }

  std::shared_ptr<std::byte[]> allocate(std::size_t bytes) override {
    const braid::CudaDeviceGuard guard(device_);
    void* memory = nullptr;
    // Not zeroed: a cudaMemset would run on the legacy default stream, unordered with the
    // reducer's streams, and could land after their first writes. Every user writes the
    // memory on a stream before reading it.
    BRAID_CUDA_CHECK(cudaMalloc(&memory, bytes == 0 ? 1 : bytes));
    // cudaFree waits for the device's work in flight, which may still read the memory.
    return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(memory),
                                        [](std::byte* p) { (void)cudaFree(p); });
  }

  Stream& producer() override {
    void* handle = current_stream_ ? current_stream_() : nullptr;
    std::lock_guard lock(mutex_);
    auto found = producers_.find(handle);
    if (found == producers_.end()) {
      found = producers_
                  .emplace(handle, std::make_unique<CudaStream>(BorrowedCudaStream{
                                       static_cast<cudaStream_t>(handle), device_}))
                  .first;
    }
    return *found->second;
  }

  Stream& reduction_stream(std::size_t bucket) override {
    return *reduction_[bucket % reduction_.size()];
  }

  void convert(const Buffer& dst, const Buffer& src, double factor, Stream& stream) override {
    BRAID_ENFORCE(dst.count() == src.count(), "bucket convert of {} elements into {}", src.count(),
                  dst.count());
    const braid::CudaDeviceGuard guard(device_);
    if (factor == 1.0 && dst.dtype() == src.dtype()) {
      if (dst.data() != src.data()) {
        BRAID_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(),
                                         cudaMemcpyDeviceToDevice, native(stream)));
      }
      return;
    }
    const int status =
        detail::launch_convert(dst.data(), kernel_type(dst.dtype()), src.data(),
                               kernel_type(src.dtype()), src.count(), factor, native(stream));
    BRAID_CUDA_CHECK(static_cast<cudaError_t>(status));
  }

  void zero(const Buffer& dst, Stream& stream) override {
    const braid::CudaDeviceGuard guard(device_);
    BRAID_CUDA_CHECK(cudaMemsetAsync(dst.data(), 0, dst.size_bytes(), native(stream)));
  }

 private:
  // Four: buckets in flight at once beyond that wait for a turn on NCCL anyway. Highest
  // priority (lowest number): a bucket's collectives are queued behind the rest of
  // backward's kernels otherwise.
  static std::vector<std::unique_ptr<CudaStream>> make_reduction_streams(int device) {
    int least = 0;
    int greatest = 0;
    {
      const braid::CudaDeviceGuard guard(device);
      BRAID_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    }
    std::vector<std::unique_ptr<CudaStream>> streams;
    for (int i = 0; i < 4; ++i) streams.push_back(std::make_unique<CudaStream>(device, greatest));
    return streams;
  }

  int device_;
  std::function<void*()> current_stream_;
  std::vector<std::unique_ptr<CudaStream>> reduction_;
  std::mutex mutex_;  // producers_: mark_ready runs on autograd's threads
  // Borrowed handles, one per stream the framework computed on: the reducer compares
  // producers by identity.
  std::map<void*, std::unique_ptr<CudaStream>> producers_;
};

}  // namespace
#endif

std::shared_ptr<BucketDevice> cuda_bucket_device(int device,
                                                 std::function<void*()> current_stream) {
#if BRAID_WITH_CUDA
  return std::make_shared<CudaBucketDevice>(device, std::move(current_stream));
#else
  (void)device;
  (void)current_stream;
  throw Error(Errc::invalid_argument,
              "gradient buckets in CUDA memory need braid built with CUDA (-Dcuda=enabled)",
              {.operation = "ddp"});
#endif
}

}  // namespace braid::dp
