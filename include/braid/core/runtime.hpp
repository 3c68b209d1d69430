// The Runtime owns an Asio io_context and the one progress thread that runs it. Every
// asynchronous thing in braid (UCX progress, store connections, collectives, timers)
// runs on that thread, so none of it needs locks; other threads hand work over with
// spawn() or run().
//
//   braid::Runtime runtime;
//   braid::Future<int> f = runtime.spawn(compute());   // compute() is asio::awaitable<int>
//   int x = f.get();
//
// Destroying the Runtime stops the thread; coroutines still suspended are destroyed
// without resuming. Objects that live on the runtime (workers, stores, communicators)
// must be destroyed before it.
#pragma once

#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <braid/core/future.hpp>

namespace braid {

namespace asio = boost::asio;

class Runtime {
 public:
  using executor_type = asio::io_context::executor_type;

  struct Options {
    // The rank printed in log lines written from the progress thread; -1: the process rank.
    int rank = -1;
    // The progress thread's name, as shown by top and gdb (at most 15 characters).
    std::string thread_name = "braid-runtime";
    // CPUs the progress thread may run on; empty: BRAID_RUNTIME_CPUS, and if that is
    // unset too, wherever the process may. Pinning it apart from the training threads
    // lets communication overlap compute instead of taking its cores (Horovod's
    // HOROVOD_THREAD_AFFINITY). A malformed list, or one with no CPU this process may
    // use, is an Error(invalid_argument or invalid_environment) from the constructor.
    std::vector<int> cpus;
  };

  Runtime();
  explicit Runtime(Options options);
  ~Runtime();

  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  asio::io_context& context() noexcept { return io_; }
  executor_type executor() noexcept { return io_.get_executor(); }
  const Options& options() const noexcept { return options_; }

  // True when called from the progress thread.
  bool on_runtime_thread() const noexcept { return std::this_thread::get_id() == thread_id_; }
  std::thread::id thread_id() const noexcept { return thread_id_; }
  // CPU time the progress thread has used since it started: everything braid does
  // asynchronously (collectives' copies and reductions, UCX progress, polling). A
  // training loop that overlaps communication with compute on busy cores pays at least
  // this much in compute time. One system call (clock_gettime on the thread's clock);
  // zero where the clock cannot be read.
  std::chrono::nanoseconds progress_cpu_time() const;

  // Starts `work` on the runtime. Safe from any thread.
  template <class T>
  Future<T> spawn(asio::awaitable<T> work) {
    Promise<T> promise(thread_id_);
    Future<T> future = promise.get_future();
    if constexpr (std::is_void_v<T>) {
      asio::co_spawn(io_, std::move(work),
                     [promise = std::move(promise)](std::exception_ptr error) mutable {
                       if (error) {
                         promise.set_exception(error);
                       } else {
                         promise.set_value();
                       }
                     });
    } else {
      asio::co_spawn(io_, std::move(work),
                     [promise = std::move(promise)](std::exception_ptr error, T value) mutable {
                       if (error) {
                         promise.set_exception(error);
                       } else {
                         promise.set_value(std::move(value));
                       }
                     });
    }
    return future;
  }

  // Runs `fn` on the progress thread and returns its result (or rethrows). Called from
  // the progress thread itself, it runs `fn` inline.
  template <class F>
  std::invoke_result_t<F> run(F&& fn) {
    using R = std::invoke_result_t<F>;
    if (on_runtime_thread()) return std::forward<F>(fn)();
    Promise<R> promise(thread_id_);
    Future<R> future = promise.get_future();
    asio::post(io_, [&fn, &promise] {
      try {
        if constexpr (std::is_void_v<R>) {
          fn();
          promise.set_value();
        } else {
          promise.set_value(fn());
        }
      } catch (...) {
        promise.set_exception(std::current_exception());
      }
    });
    return future.get();
  }

 private:
  Options options_;
  asio::io_context io_{1};  // concurrency hint 1: one thread runs it, Asio skips locking
  asio::executor_work_guard<executor_type> work_;
  std::thread thread_;
  std::thread::id thread_id_;
  int progress_clock_ = -1;  // the progress thread's CPU-time clock (a clockid_t)
};

}  // namespace braid
