#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include <braid/core/cuda_error.hpp>
#include <braid/core/cuda_support.hpp>
#include <braid/core/enforce.hpp>
#include <braid/core/log.hpp>
#include <braid/trace/cuda_timeline.hpp>
#include <braid/trace/output.hpp>

namespace braid {
namespace {

// Calibration rounds: the first one also waits out the work already on the stream, so
// its window is wide when the stream was busy; the later ones find it idle.
constexpr int kCalibrationRounds = 3;
// A calibration round spins on cudaEventQuery for this long, for a tight window on an
// idle stream, then backs off so a busy stream does not burn a core.
constexpr auto kCalibrationSpin = std::chrono::milliseconds(1);
// How long trace::write() waits for running GPU spans before writing without them.
constexpr auto kWriteFlushTimeout = std::chrono::milliseconds(100);
constexpr auto kDestroyFlushTimeout = std::chrono::seconds(1);
// Ended spans waiting before end() collects by itself.
constexpr std::size_t kCollectBacklog = 64;

std::int64_t ms_to_ns(float ms) {
  return std::llround(static_cast<double>(ms) * 1e6);
}

}  // namespace

CudaTimeline::CudaTimeline(CudaStream& stream, std::string_view track_name,
                           Deadline calibration_deadline)
    : stream_(stream.native()),
      device_(stream.device()),
      track_name_(track_name),
      track_(trace::track(track_name)) {
  try {
    calibrate(calibration_deadline);
  } catch (...) {
    destroy_events();
    throw;
  }
  // Registered last: a constructor that throws leaves no hook behind.
  write_hook_ = trace::add_write_hook([this] {
    try {
      flush(deadline_after(kWriteFlushTimeout));
    } catch (const std::exception& e) {
      log::warn("GPU spans of track '{}' left out of this trace write: {}", track_name_, e.what());
    }
  });
}

CudaTimeline::~CudaTimeline() {
  // First, so that a write() running the hook now finishes before the events go.
  trace::remove_write_hook(write_hook_);
  try {
    flush(deadline_after(kDestroyFlushTimeout));
  } catch (const std::exception& e) {
    log::warn("destroying the GPU timeline of track '{}': {}", track_name_, e.what());
  }
  std::lock_guard lock(mutex_);
  if (!open_.empty() || !ended_.empty()) {
    log::warn(
        "GPU timeline of track '{}' destroyed with {} spans never ended and {} still "
        "running; they are not recorded",
        track_name_, open_.size(), ended_.size());
  }
  destroy_events();
}

void CudaTimeline::calibrate(Deadline deadline) {
  CudaDeviceGuard guard(device_);
  cudaEvent_t probe = nullptr;
  BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&reference_, cudaEventDefault));
  BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&probe, cudaEventDefault));
  free_events_.push_back(probe);  // a span's event once calibration is done

  // Records `probe` and waits for it; false if the deadline passed first.
  auto probe_completes = [&] {
    BRAID_CUDA_CHECK(cudaEventRecord(probe, stream_));
    return poll_with_backoff(
        deadline, [&] { return cuda_ready(cudaEventQuery(probe), "cudaEventQuery"); },
        kCalibrationSpin);
  };

  std::int64_t best_window = std::numeric_limits<std::int64_t>::max();
  for (int round = 0; round < kCalibrationRounds; ++round) {
    // The event completes between `before` and `after` on the host clock; the midpoint
    // is off by at most half the window.
    const std::int64_t before = trace::now_ns();
    if (!probe_completes()) {
      if (round > 0) break;  // a later round ran out of time: keep the best one so far
      throw Error(Errc::timeout,
                  "the CUDA stream did not reach the calibration event before the deadline",
                  {.operation = "CudaTimeline calibration"});
    }
    const std::int64_t after = trace::now_ns();
    if (after - before < best_window) {
      best_window = after - before;
      reference_ns_ = before + best_window / 2;
      std::swap(reference_, probe);
      free_events_.back() = probe;
    }
  }
  calibration_error_ns_ = (best_window + 1) / 2;
}

std::uint64_t CudaTimeline::begin(trace::Category category, trace::Name name, std::uint64_t bytes) {
  if (!trace::enabled()) return 0;
  std::lock_guard lock(mutex_);
  cudaEvent_t event = record_event();
  const std::uint64_t token = next_token_++;
  open_.emplace(
      token, OpenSpan{.begin = event, .name = name.c_str(), .bytes = bytes, .category = category});
  return token;
}

void CudaTimeline::end(std::uint64_t token) {
  if (token == 0) return;
  std::lock_guard lock(mutex_);
  auto it = open_.find(token);
  BRAID_ENFORCE(it != open_.end(),
                "GPU span token {} was not begun on the timeline of track '{}', or was ended "
                "already",
                token, track_name_);
  cudaEvent_t event = record_event();
  ended_.push_back(EndedSpan{.span = it->second, .end = event});
  open_.erase(it);
  ++ended_total_;
  if (ended_.size() >= kCollectBacklog) collect_locked();
}

std::size_t CudaTimeline::collect() {
  std::lock_guard lock(mutex_);
  return collect_locked();
}

void CudaTimeline::flush(Deadline deadline) {
  std::uint64_t target = 0;
  {
    std::lock_guard lock(mutex_);
    target = ended_total_;
  }
  // The lock is taken per poll, not held while sleeping, so other threads keep
  // beginning and ending spans; spans they end meanwhile are not waited for.
  std::uint64_t left = 0;
  const bool finished = poll_with_backoff(deadline, [&] {
    std::lock_guard lock(mutex_);
    collect_locked();
    left = target - std::min(target, recorded_total_);
    return left == 0;
  });
  if (!finished) {
    throw Error(Errc::timeout,
                fmt::format("{} GPU spans of track '{}' were still running at the deadline", left,
                            track_name_),
                {.operation = "CudaTimeline::flush"});
  }
}

cudaEvent_t CudaTimeline::record_event() {
  cudaEvent_t event = nullptr;
  if (free_events_.empty()) {
    CudaDeviceGuard guard(device_);
    BRAID_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDefault));
  } else {
    event = free_events_.back();
    free_events_.pop_back();
  }
  if (cudaError_t status = cudaEventRecord(event, stream_); status != cudaSuccess) {
    free_events_.push_back(event);
    detail::throw_cuda_error(status, "cudaEventRecord", __FILE__, __LINE__);
  }
  return event;
}

std::size_t CudaTimeline::collect_locked() {
  std::size_t appended = 0;
  // Events on one stream complete in the order they were recorded, so the first span
  // whose end is not done is where the finished ones stop.
  while (!ended_.empty() && cuda_ready(cudaEventQuery(ended_.front().end), "cudaEventQuery")) {
    const EndedSpan span = ended_.front();
    float begin_ms = 0;
    float duration_ms = 0;
    BRAID_CUDA_CHECK(cudaEventElapsedTime(&begin_ms, reference_, span.span.begin));
    BRAID_CUDA_CHECK(cudaEventElapsedTime(&duration_ms, span.span.begin, span.end));
    ended_.pop_front();
    free_events_.push_back(span.span.begin);
    free_events_.push_back(span.end);

    trace::Record record;
    record.kind = trace::RecordKind::async_span;
    record.category = span.span.category;
    record.name = span.span.name;
    record.bytes = span.span.bytes;
    record.track = track_.id;
    // The end from the span's own duration, not from the reference: it stays as precise
    // as the timer however long ago the calibration was.
    record.begin_ns = reference_ns_ + ms_to_ns(begin_ms);
    record.end_ns = record.begin_ns + ms_to_ns(duration_ms);
    record.ns = true;  // from CUDA events and now_ns(), not stamps
    trace::detail::append(record);
    ++recorded_total_;
    ++appended;
  }
  return appended;
}

void CudaTimeline::destroy_events() noexcept {
  auto destroy = [](cudaEvent_t event) {
    if (event == nullptr) return;
    if (cudaError_t status = cudaEventDestroy(event); status != cudaSuccess) {
      log::warn("cudaEventDestroy of a GPU span event failed: {}", cudaGetErrorString(status));
    }
  };
  for (const auto& [token, span] : open_) destroy(span.begin);
  for (const EndedSpan& span : ended_) {
    destroy(span.span.begin);
    destroy(span.end);
  }
  for (cudaEvent_t event : free_events_) destroy(event);
  destroy(reference_);
  open_.clear();
  ended_.clear();
  free_events_.clear();
  reference_ = nullptr;
}

CudaTimeline::Scope::~Scope() {
  try {
    timeline_.end(token_);
  } catch (const std::exception& e) {
    log::warn("ending a GPU span: {}", e.what());
  }
}

}  // namespace braid
