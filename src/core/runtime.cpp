#include <braid/core/log.hpp>
#include <braid/core/runtime.hpp>
#include <pthread.h>

#include <future>

namespace braid {

Runtime::Runtime() : Runtime(Options{}) {}

Runtime::Runtime(Options options)
    : options_(std::move(options)), work_(asio::make_work_guard(io_)) {
  log::configure_from_env();
  std::promise<std::thread::id> started;
  auto started_future = started.get_future();
  thread_ = std::thread([this, &started] {
    pthread_setname_np(pthread_self(), options_.thread_name.substr(0, 15).c_str());
    if (options_.rank >= 0) log::set_thread_rank(options_.rank);
    started.set_value(std::this_thread::get_id());
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
  thread_id_ = started_future.get();
}

Runtime::~Runtime() {
  work_.reset();
  io_.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace braid
