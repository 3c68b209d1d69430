// Stream: an in-order queue of work (a host worker thread, or a CUDA stream). Event: a
// point in a stream that can be queried, waited for by the host, awaited by a
// coroutine, or waited for by another stream. The gradient reducer records an event
// after the gradients are produced, makes the communication stream wait on it, and
// awaits the communication's own event; none of that blocks a thread.
//
// Ordering contract (the same for every kind; CUDA's own semantics for CUDA streams):
//  1. Work enqueued on one stream runs in enqueue order; an item starts after the one
//     before it has finished.
//  2. stream.record(event) captures all work enqueued on that stream before the call. The
//     event completes when that work has finished. Work enqueued after the record does
//     not delay it.
//  3. stream.wait(event) makes all work enqueued on `stream` after the call start only
//     after the event's captured work has finished. It does not block the caller and
//     does not delay work enqueued on `stream` before the call. The event may come from
//     another stream of the same kind.
//  4. Waits and awaits use the point the event captured when they were issued; recording
//     the event again later moves the point for later queries, waits and awaits only.
//     Since a point only ever covers work enqueued before it, streams cannot wait on each
//     other in a cycle.
//  5. An event that was never recorded is complete.
//  6. A stream waits only on events of its own kind (InvariantError otherwise): a host
//     stream would have to block its worker on a GPU, a CUDA stream would have to block
//     CUDA's callback thread on the host. Bridge kinds with a coroutine: co_await
//     wait(cuda_event, ...) and then enqueue host work.
//  7. Failures are sticky. A host work item that throws fails its stream: later work on
//     it (and on streams that wait on its events) is skipped, and every event recorded
//     after the failure completes with that exception, which query(), synchronize() and
//     wait() rethrow. CUDA errors are sticky per CUDA's rules and surface as
//     braid::Error with cuda_category().
//
// Thread safety: Stream methods may be called from any thread; concurrent calls are
// ordered as if by a lock. An Event object is not synchronised: record it on one thread
// while another queries or waits on it and the outcome depends on which came first.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include <boost/asio/awaitable.hpp>

#include <braid/core/deadline.hpp>
#include <braid/core/foreign_completion.hpp>

namespace braid {

enum class StreamKind : std::uint8_t { host, cuda };

constexpr std::string_view to_string(StreamKind kind) noexcept {
  return kind == StreamKind::host ? "host" : "cuda";
}

class Event {
 public:
  virtual ~Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  virtual StreamKind kind() const noexcept = 0;

  // True when the captured work has finished; rethrows the stream's failure if it failed.
  virtual bool query() = 0;

  // Blocks the calling thread until the captured work has finished. Throws
  // Error(Errc::timeout) when `deadline` passes first, or the stream's failure.
  virtual void synchronize(Deadline deadline) = 0;

  // Arranges for `signal` to be called once, from whichever thread notices (possibly
  // the caller's, right away), when the captured work has finished or failed. Building
  // block of wait(); use that from coroutines.
  virtual void on_complete(ForeignSignal<> signal) = 0;

 protected:
  Event() = default;
};

class Stream {
 public:
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  virtual StreamKind kind() const noexcept = 0;

  // A new event for this stream's kind (and device). Events are meant to be reused:
  // record the same one every iteration instead of making one per record.
  virtual std::unique_ptr<Event> make_event() = 0;

  // Contract points 2 and 4. `event` must come from a stream of the same kind and device.
  virtual void record(Event& event) = 0;

  // Contract point 3. The event may come from another device; InvariantError for an
  // event of another kind.
  virtual void wait(const Event& event) = 0;

  // True when all work enqueued so far has finished; rethrows a failure.
  virtual bool query() = 0;

  // Blocks until all work enqueued before the call has finished. Throws
  // Error(Errc::timeout) when `deadline` passes first, or the stream's failure.
  virtual void synchronize(Deadline deadline) = 0;

 protected:
  Stream() = default;
};

// Suspends the calling coroutine until `event`'s captured work has finished and resumes
// it on its own executor (never on a stream worker or CUDA callback thread). Throws
// Error(Errc::timeout) when `deadline` passes first (a CUDA stream that failed instead
// throws its CUDA error), or the stream's failure. `event` must outlive the await; a
// completion arriving after the timeout is ignored.
asio::awaitable<void> wait(Event& event, Deadline deadline);

}  // namespace braid
