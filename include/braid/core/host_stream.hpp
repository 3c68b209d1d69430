// HostStream: a Stream whose work items are host functions run, in order, by one worker
// thread the stream owns. It gives host-memory collectives and CPU training the same
// record/wait/await shape as CUDA streams, so the reducer and communicators need one
// code path.
//
// Cost: enqueue is a mutex + deque push + condition-variable notify (~100-300 ns); an
// event record is one small allocation plus a queue item; a cross-stream wait is a queue
// item that blocks the waiting stream's worker until the event completes (the worker has
// nothing else it may run anyway).
//
// Destruction drains: it runs everything already enqueued (so every recorded event
// completes and no awaiting coroutine is left hanging), then joins the worker.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <braid/core/stream.hpp>

namespace braid {

namespace detail {
class HostEventState;
}  // namespace detail

class HostEvent final : public Event {
 public:
  HostEvent() = default;

  StreamKind kind() const noexcept override { return StreamKind::host; }
  bool query() override;
  void synchronize(Deadline deadline) override;
  void on_complete(ForeignSignal<> signal) override;

 private:
  friend class HostStream;
  // Null until recorded: a never-recorded event is complete.
  std::shared_ptr<detail::HostEventState> point_;
};

class HostStream final : public Stream {
 public:
  // `thread_name` names the worker thread as shown by top and gdb (at most 15 characters).
  explicit HostStream(std::string thread_name = "braid-stream");
  ~HostStream() override;

  // Runs `work` on the worker after everything enqueued before it. If it throws, the
  // stream fails (contract point 7 in stream.hpp). Safe from any thread, including from
  // a work item on this stream.
  void enqueue(std::function<void()> work);

  StreamKind kind() const noexcept override { return StreamKind::host; }
  std::unique_ptr<Event> make_event() override;
  void record(Event& event) override;
  void wait(const Event& event) override;
  bool query() override;
  // Called from this stream's own worker it would deadlock: InvariantError.
  void synchronize(Deadline deadline) override;

 private:
  struct Item {
    std::shared_ptr<detail::HostEventState> waits_for;  // blocks the worker until complete
    std::function<void()> work;                         // skipped once the stream failed
    std::shared_ptr<detail::HostEventState> completes;  // completed after `work`
  };

  void push(Item item);
  void run_worker();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Item> queue_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t finished_ = 0;
  std::exception_ptr failure_;
  bool stopping_ = false;
  std::thread worker_;  // last: started after everything it uses exists
};

}  // namespace braid
