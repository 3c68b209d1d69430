// A warn line per interval, summing up events by kind, where a line per event could flood
// the log: thousands of strangers connecting to the store, or accept failing while the
// process is out of file descriptors, cost a line every few seconds and nothing more.
//
//   auto log = std::make_shared<SummaryLog>(executor, "store on port 4242", 10s);
//   log->count("closed before hello: none within 5 s");
//   // soon after the first event, then at most once per interval:
//   // "store on port 4242, last 3.2 s: 40 x closed before hello: none within 5 s"
//
// Single-threaded: it lives on `executor`, whose thread alone may call it. Hold it in a
// shared_ptr: the timer that writes the next line holds a weak one, so the object may go
// while a line is pending (flush() first to keep it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <braid/core/deadline.hpp>
#include <braid/core/runtime.hpp>

namespace braid::transport {

class SummaryLog : public std::enable_shared_from_this<SummaryLog> {
 public:
  SummaryLog(asio::any_io_executor executor, std::string subject, Clock::duration interval);
  SummaryLog(const SummaryLog&) = delete;
  SummaryLog& operator=(const SummaryLog&) = delete;

  // One more event of `kind`, a phrase that reads after a count ("3 x <kind>").
  void count(std::string_view kind);
  // Writes what has been counted since the last line, if anything, now; the pending line
  // is cancelled.
  void flush();

 private:
  asio::steady_timer timer_;
  const std::string subject_;
  const Clock::duration interval_;
  bool armed_ = false;
  Clock::time_point first_{};         // of the events counted since the last line
  Clock::time_point last_written_{};  // epoch until the first line
  std::vector<std::pair<std::string, std::uint64_t>> counts_;
};

}  // namespace braid::transport
