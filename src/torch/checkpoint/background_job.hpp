// One thread running one job at a time for the checkpoints' save_async: a job handed over
// while the previous one runs waits for it, so at most one snapshot is in flight. A wait()
// that finds the job not yet started runs it itself: on cores the ranks already fill, the
// thread may not have been scheduled, and waking it only to wait for it would add a
// scheduler's delay to the copy's time.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace braid::torch {

class BackgroundJob {
 public:
  BackgroundJob() : thread_([this] { loop(); }) {}
  ~BackgroundJob() {
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  BackgroundJob(const BackgroundJob&) = delete;
  BackgroundJob& operator=(const BackgroundJob&) = delete;

  // Waits for the job before (throwing its error), then hands this one over: to the thread
  // now, or with `start_now` false to the next wait(), which runs it.
  void submit(std::function<void()> job, bool start_now = true) {
    wait();
    std::lock_guard lock(mutex_);
    job_ = std::move(job);
    running_ = !start_now;  // not for the thread to take
    deferred_ = !start_now;
    if (start_now) changed_.notify_all();
  }

  // Waits until no job runs (running one not started here); throws the last job's error,
  // once.
  void wait() {
    std::unique_lock lock(mutex_);
    if (job_ && (!running_ || deferred_)) {
      running_ = deferred_ = false;
      std::function<void()> job = std::exchange(job_, nullptr);
      lock.unlock();
      job();  // its error goes to the caller directly
      return;
    }
    changed_.wait(lock, [&] { return !job_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return (job_ && !running_) || closing_; });
      if (!job_ || deferred_) return;  // closing: a job left for wait() is dropped
      running_ = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        job_();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      job_ = nullptr;
      running_ = false;
      if (error) error_ = error;
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> job_;
  std::exception_ptr error_;
  bool running_ = false;   // the thread has taken job_, or may not
  bool deferred_ = false;  // job_ waits for wait()
  bool closing_ = false;
  std::thread thread_;
};

}  // namespace braid::torch
