#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include <braid/core/future.hpp>

namespace braid {
namespace {

using namespace std::chrono_literals;

TEST(Future, ValueSetOnAnotherThreadIsSeenByWaitAndGet) {
  Promise<int> promise;
  Future<int> future = promise.get_future();
  EXPECT_FALSE(future.ready());
  std::thread producer([&] {
    std::this_thread::sleep_for(10ms);
    promise.set_value(42);
  });
  future.wait();
  EXPECT_TRUE(future.ready());
  EXPECT_EQ(future.get(), 42);
  producer.join();
}

TEST(Future, WaitForTimesOutWhileNotReady) {
  Promise<void> promise;
  Future<void> future = promise.get_future();
  EXPECT_FALSE(future.wait_for(5ms));
  promise.set_value();
  EXPECT_TRUE(future.wait_for(0ms));
  EXPECT_NO_THROW(future.get());
}

TEST(Future, GetRethrowsTheProducersException) {
  Promise<std::string> promise;
  Future<std::string> future = promise.get_future();
  promise.set_exception(std::make_exception_ptr(std::runtime_error("boom")));
  EXPECT_THROW(future.get(), std::runtime_error);
}

TEST(Future, CompletingTwiceIsAnInvariantError) {
  Promise<int> promise;
  promise.set_value(1);
  EXPECT_THROW(promise.set_value(2), InvariantError);
}

TEST(Future, WaitingOnTheCompletingThreadIsRefusedInsteadOfDeadlocking) {
  Promise<int> promise(std::this_thread::get_id());
  Future<int> future = promise.get_future();
  EXPECT_THROW(future.wait(), InvariantError);
  EXPECT_THROW(future.wait_for(1s), InvariantError);
}

TEST(Future, EmptyFutureIsInvalid) {
  Future<int> future;
  EXPECT_FALSE(future.valid());
  EXPECT_THROW(future.ready(), InvariantError);
}

}  // namespace
}  // namespace braid
