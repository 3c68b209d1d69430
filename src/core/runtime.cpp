#include <braid/core/log.hpp>
#include <braid/core/runtime.hpp>
#include <pthread.h>
#include <time.h>

#include <future>
#include <type_traits>

namespace braid {

Runtime::Runtime() : Runtime(Options{}) {}

Runtime::Runtime(Options options)
    : options_(std::move(options)), work_(asio::make_work_guard(io_)) {
  log::configure_from_env();
  struct Started {
    std::thread::id id;
    clockid_t cpu_clock;
  };
  std::promise<Started> started;
  auto started_future = started.get_future();
  thread_ = std::thread([this, &started] {
    pthread_setname_np(pthread_self(), options_.thread_name.substr(0, 15).c_str());
    if (options_.rank >= 0) log::set_thread_rank(options_.rank);
    clockid_t cpu_clock = CLOCK_THREAD_CPUTIME_ID;
    if (pthread_getcpuclockid(pthread_self(), &cpu_clock) != 0) cpu_clock = -1;
    started.set_value({std::this_thread::get_id(), cpu_clock});
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        // A handler threw outside any coroutine that could carry the error to a caller.
        // Keep the runtime alive for everyone else, and say so loudly.
        log::error("unhandled exception on the runtime thread: {}", e.what());
      }
    }
  });
  const Started thread = started_future.get();
  thread_id_ = thread.id;
  progress_clock_ = thread.cpu_clock;
}

std::chrono::nanoseconds Runtime::progress_cpu_time() const {
  static_assert(std::is_same_v<clockid_t, int>, "progress_clock_ holds a clockid_t");
  timespec t{};
  if (progress_clock_ == -1 || clock_gettime(progress_clock_, &t) != 0) return {};
  return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
}

Runtime::~Runtime() {
  work_.reset();
  io_.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace braid
