#include <atomic>
#include <latch>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <braid/core/deadline.hpp>
#include <braid/core/error.hpp>
#include <braid/core/host_stream.hpp>
#include <braid/core/runtime.hpp>
#include <braid/core/stream.hpp>

namespace braid {
namespace {

using namespace std::chrono_literals;

// Holds a stream's worker inside a work item until released, so tests control exactly
// which work has run.
struct Gate {
  std::latch latch{1};
  void block(HostStream& stream) {
    stream.enqueue([this] { latch.wait(); });
  }
  void open() { latch.count_down(); }
};

// Coroutines take what they use as parameters: a lambda coroutine's captures would die
// with the temporary closure while the coroutine is suspended.
asio::awaitable<std::thread::id> await_event(Event* event, Deadline deadline) {
  co_await wait(*event, deadline);
  co_return std::this_thread::get_id();
}

TEST(HostStream, RunsWorkInEnqueueOrderOnItsOwnWorkerThread) {
  HostStream stream;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 100; ++i) {
    stream.enqueue([&, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    });
  }
  stream.synchronize(deadline_after(5s));
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(threads.front(), std::this_thread::get_id());
  for (auto id : threads) EXPECT_EQ(id, threads.front());
  EXPECT_TRUE(stream.query());
}

TEST(HostStream, EventCompletesWhenTheWorkBeforeItHasRunAndNotLater) {
  HostStream stream;
  Gate before, after;
  std::atomic<bool> first_ran{false};
  before.block(stream);
  stream.enqueue([&] { first_ran = true; });
  auto event = stream.make_event();
  stream.record(*event);
  after.block(stream);  // enqueued after the record: must not delay the event

  EXPECT_FALSE(event->query());
  EXPECT_FALSE(stream.query());
  before.open();
  event->synchronize(deadline_after(5s));
  EXPECT_TRUE(first_ran);
  EXPECT_TRUE(event->query());
  EXPECT_FALSE(stream.query());  // `after` still holds the worker
  after.open();
  stream.synchronize(deadline_after(5s));
}

TEST(HostStream, NeverRecordedEventIsComplete) {
  HostStream stream;
  auto event = stream.make_event();
  EXPECT_EQ(event->kind(), StreamKind::host);
  EXPECT_TRUE(event->query());
  EXPECT_NO_THROW(event->synchronize(deadline_after(1ms)));
  stream.wait(*event);  // nothing to wait for
  std::atomic<bool> ran{false};
  stream.enqueue([&] { ran = true; });
  stream.synchronize(deadline_after(5s));
  EXPECT_TRUE(ran);
}

TEST(HostStream, WaitOrdersLaterWorkAfterAnotherStreamsEventButNotEarlierWork) {
  HostStream producer, consumer;
  Gate gate;
  std::atomic<int> produced{0};
  gate.block(producer);
  producer.enqueue([&] { produced = 42; });
  auto ready = producer.make_event();
  producer.record(*ready);

  auto before_wait = consumer.make_event();
  consumer.enqueue([] {});
  consumer.record(*before_wait);
  consumer.wait(*ready);
  int seen = -1;
  consumer.enqueue([&] { seen = produced; });

  // The consumer's work from before the wait is not held back by the blocked producer.
  before_wait->synchronize(deadline_after(5s));
  EXPECT_FALSE(consumer.query());
  gate.open();
  consumer.synchronize(deadline_after(5s));
  EXPECT_EQ(seen, 42);
}

TEST(HostStream, WaitUsesThePointTheEventHadWhenTheWaitWasIssued) {
  HostStream producer, consumer;
  Gate first, second;
  auto event = producer.make_event();
  first.block(producer);
  producer.record(*event);
  consumer.wait(*event);
  std::atomic<bool> consumer_ran{false};
  consumer.enqueue([&] { consumer_ran = true; });
  second.block(producer);
  producer.record(*event);  // moves the point past `second` for later waits only

  first.open();
  consumer.synchronize(deadline_after(5s));
  EXPECT_TRUE(consumer_ran);
  EXPECT_FALSE(event->query());
  second.open();
  event->synchronize(deadline_after(5s));
}

TEST(HostStream, SynchronizeTimesOutWhileWorkIsPending) {
  HostStream stream;
  Gate gate;
  gate.block(stream);
  try {
    stream.synchronize(deadline_after(20ms));
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
  auto event = stream.make_event();
  stream.record(*event);
  EXPECT_THROW(event->synchronize(deadline_after(20ms)), Error);
  gate.open();
}

TEST(HostStream, SynchronizingFromItsOwnWorkerIsRefused) {
  HostStream stream;
  std::atomic<bool> refused{false};
  stream.enqueue([&] {
    try {
      stream.synchronize(deadline_after(1s));
    } catch (const InvariantError&) {
      refused = true;
    }
  });
  stream.synchronize(deadline_after(5s));
  EXPECT_TRUE(refused);
}

// An event of another kind, to check that streams refuse to mix kinds.
class ForeignKindEvent final : public Event {
 public:
  StreamKind kind() const noexcept override { return StreamKind::cuda; }
  bool query() override { return true; }
  void synchronize(Deadline) override {}
  void on_complete(ForeignSignal<> signal) override { signal.set_value(); }
};

TEST(HostStream, RefusesEventsOfAnotherKind) {
  HostStream stream;
  ForeignKindEvent event;
  EXPECT_THROW(stream.record(event), InvariantError);
  EXPECT_THROW(stream.wait(event), InvariantError);
}

TEST(HostStream, AFailedItemFailsTheStreamItsLaterEventsAndStreamsWaitingOnThem) {
  HostStream stream, downstream;
  std::atomic<bool> later_ran{false}, downstream_ran{false};
  stream.enqueue([] { throw std::runtime_error("kernel failed"); });
  stream.enqueue([&] { later_ran = true; });
  auto event = stream.make_event();
  stream.record(*event);
  downstream.wait(*event);
  downstream.enqueue([&] { downstream_ran = true; });

  EXPECT_THROW(stream.synchronize(deadline_after(5s)), std::runtime_error);
  EXPECT_THROW(event->synchronize(deadline_after(5s)), std::runtime_error);
  EXPECT_THROW(event->query(), std::runtime_error);
  EXPECT_THROW(stream.query(), std::runtime_error);
  EXPECT_THROW(downstream.synchronize(deadline_after(5s)), std::runtime_error);
  EXPECT_FALSE(later_ran);
  EXPECT_FALSE(downstream_ran);

  Runtime runtime;
  Future<std::thread::id> awaited = runtime.spawn(await_event(event.get(), deadline_after(5s)));
  EXPECT_THROW(awaited.get(), std::runtime_error);
}

TEST(HostStream, DestructionRunsEverythingAlreadyEnqueued) {
  std::atomic<int> ran{0};
  auto event = std::make_unique<HostEvent>();
  {
    HostStream stream;
    for (int i = 0; i < 5; ++i) {
      stream.enqueue([&] {
        std::this_thread::sleep_for(2ms);
        ++ran;
      });
    }
    stream.record(*event);
  }
  EXPECT_EQ(ran, 5);
  EXPECT_TRUE(event->query());
}

TEST(AwaitEvent, ResumesOnTheRuntimeThreadNotTheStreamWorker) {
  Runtime runtime;
  HostStream stream;
  Gate gate;
  std::thread::id worker;
  stream.enqueue([&] { worker = std::this_thread::get_id(); });
  gate.block(stream);
  auto event = stream.make_event();
  stream.record(*event);

  Future<std::thread::id> resumed_on = runtime.spawn(await_event(event.get(), deadline_after(5s)));
  EXPECT_FALSE(resumed_on.wait_for(20ms));
  gate.open();
  const std::thread::id id = resumed_on.get();
  EXPECT_EQ(id, runtime.thread_id());
  EXPECT_NE(id, worker);
}

TEST(AwaitEvent, AlreadyCompleteEventResumesWithoutWaiting) {
  Runtime runtime;
  HostStream stream;
  auto event = stream.make_event();
  stream.record(*event);
  event->synchronize(deadline_after(5s));
  EXPECT_EQ(runtime.spawn(await_event(event.get(), deadline_after(5s))).get(), runtime.thread_id());
}

TEST(AwaitEvent, TimesOutAndALateCompletionIsHarmless) {
  Runtime runtime;
  HostStream stream;
  Gate gate;
  gate.block(stream);
  auto event = stream.make_event();
  stream.record(*event);

  Future<std::thread::id> timed_out = runtime.spawn(await_event(event.get(), deadline_after(20ms)));
  try {
    timed_out.get();
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
    EXPECT_EQ(e.context().operation, "event wait");
  }
  // The completion arrives after the coroutine has gone: it is ignored, and the runtime
  // and stream carry on.
  gate.open();
  stream.synchronize(deadline_after(5s));
  EXPECT_EQ(runtime.spawn(await_event(event.get(), deadline_after(5s))).get(), runtime.thread_id());
}

TEST(AwaitEvent, CompletionAfterTheRuntimeIsGoneIsHarmless) {
  HostStream stream;  // outlives the runtime
  Gate gate;
  gate.block(stream);
  auto event = stream.make_event();
  stream.record(*event);
  {
    Runtime runtime;
    Future<std::thread::id> pending = runtime.spawn(await_event(event.get(), deadline_after(60s)));
    EXPECT_FALSE(pending.wait_for(10ms));
  }
  // The suspended coroutine was dropped with the runtime; the stream's signal must not
  // post into the destroyed io_context.
  gate.open();
  stream.synchronize(deadline_after(5s));
  EXPECT_TRUE(event->query());
}

TEST(AwaitEvent, ManyAwaitsOnOneEventAllResume) {
  Runtime runtime;
  HostStream stream;
  Gate gate;
  gate.block(stream);
  auto event = stream.make_event();
  stream.record(*event);
  std::vector<Future<std::thread::id>> awaits;
  for (int i = 0; i < 20; ++i) {
    awaits.push_back(runtime.spawn(await_event(event.get(), deadline_after(5s))));
  }
  gate.open();
  for (auto& f : awaits) EXPECT_EQ(f.get(), runtime.thread_id());
}

TEST(AwaitEvent, StreamDestroyedWithPendingWorkStillCompletesTheAwait) {
  Runtime runtime;
  auto event = std::make_unique<HostEvent>();
  Future<std::thread::id> awaited;
  {
    HostStream stream;
    stream.enqueue([] { std::this_thread::sleep_for(20ms); });
    stream.record(*event);
    awaited = runtime.spawn(await_event(event.get(), deadline_after(5s)));
  }
  EXPECT_EQ(awaited.get(), runtime.thread_id());
}

}  // namespace
}  // namespace braid
