#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include <braid/core/deadline.hpp>
#include <braid/core/error.hpp>
#include <braid/core/foreign_completion.hpp>
#include <braid/core/runtime.hpp>

namespace braid {
namespace {

using namespace std::chrono_literals;

// A foreign API stand-in: keeps the signal it was handed, to be fired later from
// another thread.
template <class T>
struct Parked {
  std::mutex mutex;
  std::optional<ForeignSignal<T>> signal;

  void park(ForeignSignal<T> s) {
    std::lock_guard lock(mutex);
    signal = std::move(s);
  }
  // Waits until the await has handed its signal over.
  ForeignSignal<T> take() {
    for (;;) {
      {
        std::lock_guard lock(mutex);
        if (signal) return *signal;
      }
      std::this_thread::sleep_for(1ms);
    }
  }
};

struct Resumed {
  int value = 0;
  std::thread::id thread;
};

asio::awaitable<Resumed> await_parked_int(Parked<int>* parked, Deadline deadline) {
  // A named context: GCC 12 mishandles aggregate temporaries inside co_await expressions.
  ErrorContext context{.operation = "parked"};
  int value = co_await await_foreign<int>(
      [parked](ForeignSignal<int> signal) { parked->park(std::move(signal)); }, deadline,
      std::move(context));
  co_return Resumed{value, std::this_thread::get_id()};
}

asio::awaitable<void> await_parked_void(Parked<void>* parked, Deadline deadline) {
  ErrorContext context{.rank = 2, .operation = "parked"};
  co_await await_foreign([parked](ForeignSignal<> signal) { parked->park(std::move(signal)); },
                         deadline, std::move(context));
}

TEST(ForeignCompletion, ValueFromAForeignThreadResumesTheCoroutineOnItsExecutor) {
  Runtime runtime;
  Parked<int> parked;
  Future<Resumed> resumed = runtime.spawn(await_parked_int(&parked, deadline_after(5s)));
  std::thread foreign([&] { parked.take().set_value(7); });
  const Resumed r = resumed.get();
  foreign.join();
  EXPECT_EQ(r.value, 7);
  EXPECT_EQ(r.thread, runtime.thread_id());
}

TEST(ForeignCompletion, ErrorFromTheForeignSideIsRethrown) {
  Runtime runtime;
  Parked<void> parked;
  Future<void> done = runtime.spawn(await_parked_void(&parked, deadline_after(5s)));
  std::thread foreign(
      [&] { parked.take().set_error(std::make_exception_ptr(std::runtime_error("nope"))); });
  EXPECT_THROW(done.get(), std::runtime_error);
  foreign.join();
}

TEST(ForeignCompletion, OnlyTheFirstSignalCounts) {
  Runtime runtime;
  Parked<int> parked;
  Future<Resumed> resumed = runtime.spawn(await_parked_int(&parked, deadline_after(5s)));
  ForeignSignal<int> signal = parked.take();
  signal.set_value(1);
  signal.set_value(2);
  signal.set_error(std::make_exception_ptr(std::runtime_error("late")));
  EXPECT_EQ(resumed.get().value, 1);
}

TEST(ForeignCompletion, DeadlineThrowsTimeoutWithTheContextAndLateSignalsAreIgnored) {
  Runtime runtime;
  Parked<void> parked;
  Future<void> done = runtime.spawn(await_parked_void(&parked, deadline_after(20ms)));
  try {
    done.get();
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
    EXPECT_EQ(e.context().operation, "parked");
    EXPECT_EQ(e.context().rank, 2);
  }
  parked.take().set_value();  // the await is gone; this must do nothing
  EXPECT_EQ(runtime.run([] { return 3; }), 3);
}

asio::awaitable<void> await_throwing_start() {
  co_await await_foreign([](ForeignSignal<>) { throw Error(Errc::refused, "could not register"); },
                         deadline_after(5s), ErrorContext());
}

TEST(ForeignCompletion, ExceptionFromStartIsRethrownByTheAwait) {
  Runtime runtime;
  try {
    runtime.spawn(await_throwing_start()).get();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::refused);
  }
}

asio::awaitable<void> await_parked_then_flag(Parked<void>* parked, std::atomic<bool>* resumed) {
  co_await await_parked_void(parked, deadline_after(60s));
  *resumed = true;
}

TEST(ForeignCompletion, SignalAfterTheRuntimeIsDestroyedIsIgnored) {
  Parked<void> parked;
  std::atomic<bool> resumed{false};
  {
    Runtime runtime;
    runtime.spawn(await_parked_then_flag(&parked, &resumed));
    parked.take();
  }
  // The suspended coroutine was dropped with the runtime; the signal must neither resume
  // it nor post into the destroyed io_context.
  parked.take().set_value();
  std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(resumed);
}

}  // namespace
}  // namespace braid
