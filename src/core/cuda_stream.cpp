#include <algorithm>
#include <chrono>
#include <type_traits>

#include <fmt/format.h>

#include <braid/core/cuda_error.hpp>
#include <braid/core/cuda_stream.hpp>
#include <braid/core/cuda_support.hpp>
#include <braid/core/enforce.hpp>
#include <braid/core/log.hpp>

namespace braid {
namespace {

// Host-side waits poll (CUDA's blocking synchronise calls take no deadline).
template <class Done>
void poll_until(Deadline deadline, Done done, const char* operation) {
  if (!poll_with_backoff(deadline, done)) {
    throw Error(Errc::timeout, "CUDA work did not finish before the deadline",
                {.operation = operation});
  }
}

void signal_from_cuda(void* user_data) {
  // Runs on CUDA's callback thread: no CUDA calls here, only a post to the awaiting
  // executor.
  std::unique_ptr<ForeignSignal<>> signal(static_cast<ForeignSignal<>*>(user_data));
  signal->set_value();
}

// `device` < 0: any device (a stream may wait on another device's event).
template <class E>
auto& as_cuda_event(E& event, int device) {
  using Cuda = std::conditional_t<std::is_const_v<E>, const CudaEvent, CudaEvent>;
  auto* cuda = dynamic_cast<Cuda*>(&event);
  BRAID_ENFORCE(cuda != nullptr, "a CUDA stream can only use CUDA events, not {} events",
                to_string(event.kind()));
  BRAID_ENFORCE(device < 0 || cuda->device() == device,
                "the event belongs to CUDA device {} but the stream to device {}", cuda->device(),
                device);
  return *cuda;
}

}  // namespace

CudaEvent::CudaEvent(int device) : device_(device) {
  CudaDeviceGuard guard(device);
  BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  // Both calls return at once; CUDA releases the objects when pending work is done, and
  // a pending host function owns its signal.
  if (notify_stream_ != nullptr) {
    if (cudaError_t status = cudaStreamDestroy(notify_stream_); status != cudaSuccess) {
      log::warn("cudaStreamDestroy of an event's helper stream failed: {}",
                cudaGetErrorString(status));
    }
  }
  if (cudaError_t status = cudaEventDestroy(event_); status != cudaSuccess) {
    log::warn("cudaEventDestroy failed: {}", cudaGetErrorString(status));
  }
}

bool CudaEvent::query() {
  return cuda_ready(cudaEventQuery(event_), "cudaEventQuery");
}

void CudaEvent::synchronize(Deadline deadline) {
  poll_until(
      deadline, [this] { return query(); }, "event synchronize");
}

void CudaEvent::on_complete(ForeignSignal<> signal) {
  if (notify_stream_ == nullptr) {
    CudaDeviceGuard guard(device_);
    BRAID_CUDA_CHECK(cudaStreamCreateWithFlags(&notify_stream_, cudaStreamNonBlocking));
  }
  BRAID_CUDA_CHECK(cudaStreamWaitEvent(notify_stream_, event_, 0));
  auto owned = std::make_unique<ForeignSignal<>>(std::move(signal));
  BRAID_CUDA_CHECK(cudaLaunchHostFunc(notify_stream_, &signal_from_cuda, owned.get()));
  (void)owned.release();  // signal_from_cuda deletes it
}

CudaStream::CudaStream(int device, int priority) : device_(device), owned_(true) {
  CudaDeviceGuard guard(device);
  BRAID_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
}

CudaStream::CudaStream(BorrowedCudaStream borrowed)
    : stream_(borrowed.stream), device_(borrowed.device), owned_(false) {}

CudaStream::~CudaStream() {
  if (!owned_) return;
  if (cudaError_t status = cudaStreamDestroy(stream_); status != cudaSuccess) {
    log::warn("cudaStreamDestroy failed: {}", cudaGetErrorString(status));
  }
}

std::unique_ptr<Event> CudaStream::make_event() {
  return std::make_unique<CudaEvent>(device_);
}

// Record, wait and query make the stream's device current: a borrowed null handle (the
// legacy default stream, which libtorch's default stream is) means the calling thread's
// current device's, and a rank's thread training on device 1 may have device 0 current.
void CudaStream::record(Event& event) {
  const CudaDeviceGuard guard(device_);
  BRAID_CUDA_CHECK(cudaEventRecord(as_cuda_event(event, device_).native(), stream_));
}

void CudaStream::wait(const Event& event) {
  const CudaDeviceGuard guard(device_);
  BRAID_CUDA_CHECK(cudaStreamWaitEvent(stream_, as_cuda_event(event, -1).native(), 0));
}

bool CudaStream::query() {
  const CudaDeviceGuard guard(device_);
  return cuda_ready(cudaStreamQuery(stream_), "cudaStreamQuery");
}

void CudaStream::synchronize(Deadline deadline) {
  poll_until(
      deadline, [this] { return query(); }, "stream synchronize");
}

}  // namespace braid
