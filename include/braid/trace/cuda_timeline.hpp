// CudaTimeline: trace spans measured on the GPU from CUDA timing events, placed on the
// host's steady clock next to the CPU spans. Built only with CUDA (BRAID_WITH_CUDA);
// CUDA failures are thrown as braid::Error in cuda_category() (cuda_error.hpp).
//
//   CudaTimeline timeline(stream, "gpu0/compute");
//   {
//     CudaTimeline::Scope span(timeline, trace::Category::compute, "forward");
//     launch_forward(stream.native());
//   }  // the span covers the GPU work enqueued inside the scope, not the host's time
//   trace::write();  // flushes finished GPU spans first, through a write hook
//
// A span is a pair of timing events recorded on the stream around the work. Once its end
// event has completed, collect() converts both events to steady-clock nanoseconds and
// appends one async_span record to the timeline's track; until then the span is held
// here, because the GPU has not yet said when it ran.
//
// Cost. begin() and end() each take the timeline's mutex and make one cudaEventRecord
// (~1-3 us; timing events cost more to record than cudaEventDisableTiming ones), with
// no allocation once the event pool has grown to the peak number of spans in flight.
// With tracing off, begin() is one relaxed atomic load. The mutex is held across
// cudaEventRecord, so that the order of end events on the stream is the order of the
// spans waiting here and collect() can stop at the first unfinished one; threads that
// share a timeline therefore serialise their begin/end/collect calls, and a
// cudaEventRecord that blocks on a full launch queue blocks them all. collect() costs a
// cudaEventQuery plus two cudaEventElapsedTime per finished span (~1 us each).
//
// Accuracy. The constructor calibrates once: it records a timing event on the stream
// between two now_ns() reads, three times, and keeps the tightest window. Times are
// exact to ± calibration_error_ns() (half that window, usually a few microseconds when
// the stream is idle), plus the float precision of cudaEventElapsedTime over the time
// since calibration (~elapsed / 2^24: 60 ns after a second, 4 us after a minute, 0.2 ms
// after an hour) and whatever the GPU timer drifts from the host clock, which is not
// corrected: a long job that wants tight placement makes a new timeline to recalibrate.
// Durations come from a span's own two events and are good to the timer's ~0.5 us.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>

#include <braid/core/cuda_stream.hpp>
#include <braid/core/deadline.hpp>
#include <braid/trace/recorder.hpp>

namespace braid {

class CudaTimeline {
 public:
  // Spans recorded on `stream` land on the trace track named `track_name`
  // (trace::track()). The stream must outlive the timeline. Calibrating waits for the
  // work already on the stream and throws Error(Errc::timeout) if it is not done by
  // `calibration_deadline`. Registers a trace::add_write_hook so trace::write() includes
  // the GPU spans finished by then (the hook waits at most 100 ms for running ones).
  CudaTimeline(CudaStream& stream, std::string_view track_name,
               Deadline calibration_deadline = default_deadline());
  // Removes the write hook, waits up to one second for ended spans to finish and
  // records them, and destroys the events (CUDA releases those still pending when their
  // work is done). Spans never ended, or still running, are lost with a warning. Never
  // throws.
  ~CudaTimeline();
  CudaTimeline(const CudaTimeline&) = delete;
  CudaTimeline& operator=(const CudaTimeline&) = delete;

  // Records the span's begin event on the stream and returns its token for end(). With
  // tracing off (trace::enabled() false) records nothing and returns 0.
  std::uint64_t begin(trace::Category category, trace::Name name, std::uint64_t bytes = 0);
  // Records the span's end event on the stream. end(0) does nothing; a token that was not
  // begun here, or was ended already, throws InvariantError. Once 64 ended spans are
  // waiting, also collects, so a timeline nobody collects holds only the GPU's backlog.
  void end(std::uint64_t token);

  // Non-blocking: appends a trace record for every ended span whose end event has
  // completed, and returns how many it appended. Spans resolve in the order they ended.
  std::size_t collect();
  // Collects until every span ended before the call is recorded, polling with a backoff
  // from 10 us to 1 ms. Spans still open are not waited for. Throws Error(Errc::timeout)
  // if some are still running at `deadline`; they stay here for a later collect().
  void flush(Deadline deadline);

  trace::Track track() const noexcept { return track_; }
  // Half the host-clock window in which the calibration event completed: how far a
  // converted time may be from the host clock, before float precision and drift.
  std::int64_t calibration_error_ns() const noexcept { return calibration_error_ns_; }

  // Begins at construction and ends at destruction, like trace::Span. A CUDA failure
  // while ending is logged, not thrown (it happens in a destructor).
  class Scope {
   public:
    Scope(CudaTimeline& timeline, trace::Category category, trace::Name name,
          std::uint64_t bytes = 0)
        : timeline_(timeline), token_(timeline.begin(category, name, bytes)) {}
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CudaTimeline& timeline_;
    std::uint64_t token_;
  };

 private:
  struct OpenSpan {
    cudaEvent_t begin = nullptr;
    const char* name = nullptr;
    std::uint64_t bytes = 0;
    trace::Category category = trace::Category::user;
  };
  struct EndedSpan {
    OpenSpan span;
    cudaEvent_t end = nullptr;
  };

  void calibrate(Deadline deadline);
  // Need mutex_.
  cudaEvent_t record_event();
  std::size_t collect_locked();
  void destroy_events() noexcept;

  cudaStream_t stream_;
  int device_;
  std::string track_name_;
  trace::Track track_;
  cudaEvent_t reference_ = nullptr;  // the calibration event, completed at reference_ns_
  std::int64_t reference_ns_ = 0;
  std::int64_t calibration_error_ns_ = 0;
  std::uint64_t write_hook_ = 0;

  std::mutex mutex_;
  std::vector<cudaEvent_t> free_events_;
  std::unordered_map<std::uint64_t, OpenSpan> open_;
  std::deque<EndedSpan> ended_;  // in the order their end events were recorded
  std::uint64_t next_token_ = 1;
  std::uint64_t ended_total_ = 0;     // spans ever ended
  std::uint64_t recorded_total_ = 0;  // spans ever recorded (a prefix of the ended ones)
};

}  // namespace braid
