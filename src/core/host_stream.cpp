#include <pthread.h>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>
#include <braid/core/host_stream.hpp>

namespace braid {
namespace detail {

// One recorded point of a host stream: completed by the stream's worker when it reaches
// the point, with the stream's failure if it had failed by then.
class HostEventState {
 public:
  void complete(std::exception_ptr failure) {
    std::vector<ForeignSignal<>> waiters;
    {
      std::lock_guard lock(mutex_);
      done_ = true;
      failure_ = failure;
      waiters.swap(waiters_);
    }
    done_changed_.notify_all();
    for (const auto& signal : waiters) notify(signal, failure);
  }

  // True once complete; rethrows the failure it completed with.
  bool poll() {
    std::lock_guard lock(mutex_);
    if (done_ && failure_) std::rethrow_exception(failure_);
    return done_;
  }

  // Blocks until complete (false if `deadline` passed first); rethrows the failure.
  bool wait_until(Deadline deadline) {
    std::unique_lock lock(mutex_);
    if (!done_changed_.wait_until(lock, deadline, [&] { return done_; })) return false;
    if (failure_) std::rethrow_exception(failure_);
    return true;
  }

  // Blocks until complete and returns the failure, if any. Only stream workers call it,
  // and a point only covers work enqueued before it, so it cannot wait on a cycle.
  std::exception_ptr wait() {
    std::unique_lock lock(mutex_);
    done_changed_.wait(lock, [&] { return done_; });
    return failure_;
  }

  void on_complete(ForeignSignal<> signal) {
    std::exception_ptr failure;
    {
      std::lock_guard lock(mutex_);
      if (!done_) {
        waiters_.push_back(std::move(signal));
        return;
      }
      failure = failure_;
    }
    notify(signal, failure);
  }

 private:
  static void notify(const ForeignSignal<>& signal, const std::exception_ptr& failure) {
    if (failure) {
      signal.set_error(failure);
    } else {
      signal.set_value();
    }
  }

  std::mutex mutex_;
  std::condition_variable done_changed_;
  bool done_ = false;
  std::exception_ptr failure_;
  std::vector<ForeignSignal<>> waiters_;
};

}  // namespace detail

namespace {

[[noreturn]] void throw_timeout(std::string_view what, std::string_view operation) {
  throw Error(Errc::timeout, fmt::format("{} did not finish before the deadline", what),
              {.operation = std::string(operation)});
}

}  // namespace

bool HostEvent::query() {
  return !point_ || point_->poll();
}

void HostEvent::synchronize(Deadline deadline) {
  if (point_ && !point_->wait_until(deadline)) {
    throw_timeout("work recorded by a host event", "event synchronize");
  }
}

void HostEvent::on_complete(ForeignSignal<> signal) {
  if (!point_) {
    signal.set_value();
    return;
  }
  point_->on_complete(std::move(signal));
}

HostStream::HostStream(std::string thread_name)
    : worker_([this, name = std::move(thread_name)] {
        pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
        run_worker();
      }) {}

HostStream::~HostStream() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void HostStream::enqueue(std::function<void()> work) {
  BRAID_ENFORCE(work != nullptr, "HostStream::enqueue needs a function");
  push(Item{.work = std::move(work)});
}

std::unique_ptr<Event> HostStream::make_event() {
  return std::make_unique<HostEvent>();
}

namespace {
template <class E>
auto& as_host_event(E& event) {
  using Host = std::conditional_t<std::is_const_v<E>, const HostEvent, HostEvent>;
  auto* host = dynamic_cast<Host*>(&event);
  BRAID_ENFORCE(host != nullptr, "a host stream can only use host events, not {} events",
                to_string(event.kind()));
  return *host;
}
}  // namespace

void HostStream::record(Event& event) {
  HostEvent& host = as_host_event(event);
  auto point = std::make_shared<detail::HostEventState>();
  push(Item{.completes = point});
  host.point_ = std::move(point);
}

void HostStream::wait(const Event& event) {
  const HostEvent& host = as_host_event(event);
  if (host.point_) push(Item{.waits_for = host.point_});
}

bool HostStream::query() {
  std::lock_guard lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
  return finished_ == enqueued_;
}

void HostStream::synchronize(Deadline deadline) {
  BRAID_ENFORCE(std::this_thread::get_id() != worker_.get_id(),
                "synchronizing a host stream from its own worker would deadlock");
  std::unique_lock lock(mutex_);
  const std::uint64_t target = enqueued_;
  if (!changed_.wait_until(lock, deadline, [&] { return finished_ >= target; })) {
    throw_timeout(fmt::format("{} host stream work items", target - finished_),
                  "stream synchronize");
  }
  if (failure_) std::rethrow_exception(failure_);
}

void HostStream::push(Item item) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(item));
    ++enqueued_;
  }
  changed_.notify_all();
}

void HostStream::run_worker() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything enqueued has run
    Item item = std::move(queue_.front());
    queue_.pop_front();
    std::exception_ptr failure = failure_;
    lock.unlock();

    if (item.waits_for) {
      std::exception_ptr upstream = item.waits_for->wait();
      if (!failure) failure = upstream;
    }
    if (item.work && !failure) {
      try {
        item.work();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    if (item.completes) item.completes->complete(failure);
    item = Item{};  // the work's captures die here, outside the lock

    lock.lock();
    failure_ = failure;
    ++finished_;
    changed_.notify_all();
  }
}

}  // namespace braid
