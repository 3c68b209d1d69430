#include <time.h>

#include <braid/trace/compute_span.hpp>

namespace braid::trace {
namespace {

std::int64_t thread_cpu_ns() noexcept {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return std::int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

}  // namespace

ComputeSpan::ComputeSpan(Name name, Track track) noexcept : span_(Category::compute, name, track) {
  if (!span_.active()) return;
  thread_ = std::this_thread::get_id();
  cpu_start_ns_ = thread_cpu_ns();
  wall_start_ns_ = now_ns();
}

ComputeSpan& ComputeSpan::operator=(ComputeSpan&& other) noexcept {
  if (this != &other) {
    end();
    span_ = std::move(other.span_);
    thread_ = other.thread_;
    wall_start_ns_ = other.wall_start_ns_;
    cpu_start_ns_ = other.cpu_start_ns_;
    has_user_arg_ = other.has_user_arg_;
  }
  return *this;
}

void ComputeSpan::arg(Name key, std::int64_t value) noexcept {
  if (has_user_arg_) return;
  has_user_arg_ = true;
  span_.arg(key, value);
}

void ComputeSpan::end() noexcept {
  if (!span_.active()) return;
  if (std::this_thread::get_id() == thread_) {
    const std::int64_t wall = now_ns() - wall_start_ns_;
    const std::int64_t cpu = thread_cpu_ns() - cpu_start_ns_;
    // The two clocks tick apart by a few microseconds: a span that never left its core
    // reads about zero either way.
    span_.arg("off_core_ns", wall > cpu ? wall - cpu : 0);
  }
  span_.end();
}

}  // namespace braid::trace
