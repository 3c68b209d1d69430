#include <atomic>
#include <ctime>
#include <sched.h>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <gtest/gtest.h>

#include <braid/core/deadline.hpp>
#include <braid/core/error.hpp>
#include <braid/core/log.hpp>
#include <braid/core/runtime.hpp>

namespace braid {
namespace {

using namespace std::chrono_literals;

asio::awaitable<int> add_after(int a, int b, std::chrono::milliseconds delay) {
  asio::steady_timer timer(co_await asio::this_coro::executor, delay);
  co_await timer.async_wait(asio::use_awaitable);
  co_return a + b;
}

asio::awaitable<void> fail_with(Errc code) {
  co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
  throw Error(code, "as asked", {.rank = 1, .operation = "test"});
}

TEST(Runtime, SpawnedCoroutineResultArrivesThroughTheFuture) {
  Runtime runtime;
  Future<int> sum = runtime.spawn(add_after(2, 3, 1ms));
  EXPECT_EQ(sum.get(), 5);
}

TEST(Runtime, ErrorsThrownInCoroutinesAreRethrownByGet) {
  Runtime runtime;
  Future<void> failed = runtime.spawn(fail_with(Errc::peer_failed));
  try {
    failed.get();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::peer_failed);
    EXPECT_EQ(e.context().rank, 1);
  }
}

TEST(Runtime, ManyCoroutinesRunConcurrentlyOnTheOneProgressThread) {
  Runtime runtime;
  std::vector<Future<int>> futures;
  for (int i = 0; i < 100; ++i) futures.push_back(runtime.spawn(add_after(i, 1, 5ms)));
  auto start = Clock::now();
  for (int i = 0; i < 100; ++i) EXPECT_EQ(futures[i].get(), i + 1);
  // Serialised, 100 timers of 5ms would take 500ms; concurrent ones take about 5ms.
  EXPECT_LT(Clock::now() - start, 400ms);
}

TEST(Runtime, RunExecutesOnTheProgressThreadAndReturnsItsValue) {
  Runtime runtime;
  EXPECT_FALSE(runtime.on_runtime_thread());
  auto id = runtime.run([&] {
    EXPECT_TRUE(runtime.on_runtime_thread());
    return std::this_thread::get_id();
  });
  EXPECT_EQ(id, runtime.thread_id());
  EXPECT_THROW(runtime.run([]() -> int { throw Error(Errc::closed, "x"); }), Error);
}

// The progress thread's CPU time counts work done there, not time spent elsewhere: 20 ms
// of spinning on it shows up; 50 ms of the caller sleeping does not.
TEST(Runtime, ProgressCpuTimeCountsOnlyWorkOnTheProgressThread) {
  Runtime runtime;
  const auto before = runtime.progress_cpu_time();
  std::this_thread::sleep_for(50ms);
  const auto idle = runtime.progress_cpu_time() - before;
  EXPECT_LT(idle, 10ms);
  runtime.run([] {
    timespec start{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    for (timespec now = start;; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now)) {
      if ((now.tv_sec - start.tv_sec) * 1'000'000'000L + (now.tv_nsec - start.tv_nsec) >=
          20'000'000L)
        break;
    }
  });
  EXPECT_GE(runtime.progress_cpu_time() - before, 20ms);
}

// The progress thread runs where it is told to, and nowhere else; a set with no CPU the
// process may use is refused at construction.
TEST(Runtime, ProgressThreadRunsOnTheCpusItIsGiven) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int last = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) last = cpu;
  }
  Runtime pinned({.cpus = {last}});
  const std::vector<int> where = pinned.run([] {
    cpu_set_t mine;
    CPU_ZERO(&mine);
    sched_getaffinity(0, sizeof mine, &mine);
    std::vector<int> cpus;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &mine)) cpus.push_back(cpu);
    }
    return cpus;
  });
  EXPECT_EQ(where, std::vector<int>{last});
  try {
    Runtime refused({.cpus = {CPU_SETSIZE - 1}});  // no such CPU here
    FAIL() << "a CPU outside the process's set was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("names no CPU this process may run on"), std::string::npos)
        << e.what();
  }
}

TEST(Runtime, ProgressThreadLogsWithTheRuntimesRank) {
  Runtime runtime({.rank = 3});
  EXPECT_EQ(runtime.run([] { return log::current_rank(); }), 3);
}

TEST(Runtime, WaitingOnAFutureFromTheProgressThreadIsRefused) {
  Runtime runtime;
  Future<int> slow = runtime.spawn(add_after(1, 1, 50ms));
  EXPECT_THROW(runtime.run([&] { slow.wait(); }), InvariantError);
  EXPECT_EQ(slow.get(), 2);
}

asio::awaitable<void> set_after_long_wait(std::atomic<bool>& flag) {
  co_await add_after(0, 0, 10s);
  flag = true;
}

TEST(Runtime, DestroyingTheRuntimeDropsSuspendedCoroutinesWithoutHanging) {
  std::atomic<bool> resumed{false};
  const auto start = Clock::now();
  {
    Runtime runtime;
    runtime.spawn(set_after_long_wait(resumed));
  }
  EXPECT_FALSE(resumed);
  EXPECT_LT(Clock::now() - start, 5s);
}

}  // namespace
}  // namespace braid
