// CudaStream and CudaEvent: the Stream/Event contract (stream.hpp) over cudaStream_t and
// cudaEvent_t. Built only with CUDA (BRAID_WITH_CUDA). Every CUDA failure is thrown as
// braid::Error in cuda_category() (cuda_error.hpp).
//
// Awaiting a CudaEvent (braid::wait) uses cudaLaunchHostFunc, not polling: the event gets
// a private helper stream (created on its first await, cudaStreamNonBlocking) that does
// cudaStreamWaitEvent(event) and then launches a host function that only posts the
// completion to the awaiting executor. Why: no CPU is spent while waiting and the
// runtime thread stays free for UCX progress, where polling would trade CPU for latency
// with a timer; and the user's streams are never stalled by the host function (CUDA
// holds back work behind a host function until it returns, which is why it runs on the
// helper stream and not the recording one). Cost per await: two CUDA calls on the
// awaiting thread (~2-5 us) and the driver's callback latency after the GPU passes the
// point (typically 5-30 us). Awaits of one event are served in await order. If the CUDA
// context fails, CUDA never calls the host function: the await times out, reports the
// CUDA error through query(), and leaks one small signal object.
//
// Host-side synchronize() polls cudaEventQuery / cudaStreamQuery with a backoff from
// 10 us to 1 ms, because CUDA's blocking synchronize calls take no deadline.
#pragma once

#include <memory>

#include <cuda_runtime_api.h>

#include <braid/core/stream.hpp>

namespace braid {

class CudaEvent final : public Event {
 public:
  // An event on `device`, created with cudaEventDisableTiming (timing events cost more
  // to record and are only needed for GPU trace spans).
  explicit CudaEvent(int device);
  ~CudaEvent() override;

  cudaEvent_t native() const noexcept { return event_; }
  int device() const noexcept { return device_; }

  StreamKind kind() const noexcept override { return StreamKind::cuda; }
  bool query() override;
  void synchronize(Deadline deadline) override;
  void on_complete(ForeignSignal<> signal) override;

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
  cudaStream_t notify_stream_ = nullptr;  // created on the first on_complete()
};

// A stream somebody else owns (libtorch's current stream, say), used but not destroyed.
struct BorrowedCudaStream {
  cudaStream_t stream;
  int device;
};

class CudaStream final : public Stream {
 public:
  // A new stream on `device` created with cudaStreamNonBlocking (no implicit
  // synchronisation with the legacy default stream). Lower `priority` numbers run first
  // where the device supports priorities (cudaDeviceGetStreamPriorityRange); 0 is default.
  explicit CudaStream(int device, int priority = 0);
  explicit CudaStream(BorrowedCudaStream borrowed);
  // cudaStreamDestroy returns at once; CUDA still finishes the work already enqueued, so
  // recorded events complete and awaits resume.
  ~CudaStream() override;

  cudaStream_t native() const noexcept { return stream_; }
  int device() const noexcept { return device_; }

  StreamKind kind() const noexcept override { return StreamKind::cuda; }
  std::unique_ptr<Event> make_event() override;
  void record(Event& event) override;
  void wait(const Event& event) override;
  bool query() override;
  void synchronize(Deadline deadline) override;

 private:
  cudaStream_t stream_ = nullptr;
  int device_;
  bool owned_;
};

}  // namespace braid
