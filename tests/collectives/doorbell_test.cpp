// Doorbells (collectives/doorbell.hpp): a shared-memory wait past its spin sleeps until a
// peer that raises a flag rings it. Two ranks' doorbells here live in one process, each
// connected to the other through pidfd_getfd, as ranks on a node are; the sleeper runs
// on an io_context of its own, as waits do on the runtime thread.
#include "collectives/doorbell.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <future>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>
#include <gtest/gtest.h>

namespace braid::collectives::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Ranks 0 and 1 of a node, with the words where each counts its sleepers (in the arena's
// segment, in a communicator).
struct TwoRanks {
  Doorbell rank0;
  Doorbell rank1;
  std::uint32_t asleep[2] = {0, 0};

  TwoRanks() {
    const int fd0 = rank0.open();
    const int fd1 = rank1.open();
    EXPECT_GE(fd0, 0);
    EXPECT_GE(fd1, 0);
    EXPECT_EQ(rank0.connect(1, getpid(), fd1), 0) << "pidfd_getfd of our own process";
    EXPECT_EQ(rank1.connect(0, getpid(), fd0), 0);
    rank0.arm(0, {&asleep[0], &asleep[1]});
    rank1.arm(1, {&asleep[0], &asleep[1]});
  }
  std::uint32_t sleeping(int rank) const {
    return std::atomic_ref<const std::uint32_t>(asleep[rank]).load();
  }
};

// Rank 0's sleep_unless(flag, fallback), and how long it took. (Coroutines take what they
// use as parameters: a lambda's captures would be gone by the time it runs.)
asio::awaitable<Clock::duration> sleep_for_flag(Doorbell* doorbell, std::atomic<bool>* flag,
                                                milliseconds fallback) {
  auto ready = [flag] { return flag->load(); };
  const auto started = Clock::now();
  co_await doorbell->sleep_unless(ready, fallback);
  co_return Clock::now() - started;
}

// Runs it on the io_context; the future is ready when it returns.
std::future<Clock::duration> sleep_on_thread(asio::io_context& io, TwoRanks& ranks,
                                             std::atomic<bool>& flag, milliseconds fallback) {
  return asio::co_spawn(io, sleep_for_flag(&ranks.rank0, &flag, fallback), asio::use_future);
}

asio::awaitable<Clock::duration> wait_for_turn(Doorbell* doorbell, milliseconds fallback) {
  const auto started = Clock::now();
  co_await doorbell->wait_for_turn(fallback);
  co_return Clock::now() - started;
}

TEST(Doorbell, ARingWakesTheSleeperLongBeforeItsFallback) {
  asio::io_context io{1};  // first: the doorbells hand it their descriptors at the end
  TwoRanks ranks;
  std::atomic<bool> flag{false};
  auto slept = sleep_on_thread(io, ranks, flag, milliseconds(20'000));
  std::thread runtime([&io] { io.run(); });
  while (ranks.sleeping(0) == 0) std::this_thread::sleep_for(milliseconds(1));
  std::this_thread::sleep_for(milliseconds(20));  // well into the wait itself
  flag = true;
  ranks.rank1.ring_sleepers();  // what raising a flag does
  ASSERT_EQ(slept.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the ring did not wake it";
  runtime.join();
  EXPECT_LT(slept.get(), std::chrono::seconds(5));
  EXPECT_EQ(ranks.sleeping(0), 0u) << "awake again";
}

TEST(Doorbell, ASleeperWhoseFlagIsAlreadyUpDoesNotWaitAtAll) {
  asio::io_context io{1};  // first: the doorbells hand it their descriptors at the end
  TwoRanks ranks;
  std::atomic<bool> flag{true};
  auto slept = sleep_on_thread(io, ranks, flag, milliseconds(20'000));
  io.run();
  EXPECT_LT(slept.get(), std::chrono::seconds(5));
}

TEST(Doorbell, RingsFromBeforeTheSleepDoNotWakeIt) {
  asio::io_context io{1};
  TwoRanks ranks;
  // A ring rank 0 slept through earlier, for a flag it has seen since.
  std::atomic_ref<std::uint32_t>(ranks.asleep[0]).store(1);
  ranks.rank1.ring_sleepers();
  std::atomic_ref<std::uint32_t>(ranks.asleep[0]).store(0);

  std::atomic<bool> flag{false};
  auto slept = sleep_on_thread(io, ranks, flag, milliseconds(300));
  io.run();
  EXPECT_GE(slept.get(), milliseconds(250)) << "woke at once for the old ring";
}

TEST(Doorbell, NoRingReachesARankThatIsNotAsleep) {
  asio::io_context io{1};
  TwoRanks ranks;
  ranks.rank1.ring_sleepers();  // rank 0 counts no sleeper: nothing is written
  std::atomic<bool> flag{false};
  auto slept = sleep_on_thread(io, ranks, flag, milliseconds(300));
  io.run();
  EXPECT_GE(slept.get(), milliseconds(250));
}

TEST(Doorbell, APassingTurnWakesEveryOperationWaitingForIt) {
  asio::io_context io{1};  // first: the doorbells hand it their descriptors at the end
  TwoRanks ranks;
  auto first =
      asio::co_spawn(io, wait_for_turn(&ranks.rank0, milliseconds(20'000)), asio::use_future);
  auto second =
      asio::co_spawn(io, wait_for_turn(&ranks.rank0, milliseconds(20'000)), asio::use_future);
  std::thread runtime([&io] { io.run(); });
  // The turn passes on the runtime thread, as it does in the arena; again and again, as
  // the test cannot see when both have gone to sleep.
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < give_up &&
         (first.wait_for(milliseconds(0)) != std::future_status::ready ||
          second.wait_for(milliseconds(0)) != std::future_status::ready)) {
    asio::post(io, [&ranks] { ranks.rank0.turn_passed(); });
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_EQ(first.wait_for(milliseconds(0)), std::future_status::ready);
  ASSERT_EQ(second.wait_for(milliseconds(0)), std::future_status::ready);
  runtime.join();
  EXPECT_LT(first.get(), std::chrono::seconds(5));
  EXPECT_LT(second.get(), std::chrono::seconds(5));
}

TEST(Doorbell, ConnectingToAProcessThatIsGoneFailsWithItsErrno) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  Doorbell doorbell;
  ASSERT_GE(doorbell.open(), 0);
  EXPECT_EQ(doorbell.connect(1, child, 3), ESRCH);
}

}  // namespace
}  // namespace braid::collectives::detail
