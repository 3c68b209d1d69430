#include "transport/summary_log.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <braid/core/log.hpp>

namespace braid::transport {

SummaryLog::SummaryLog(asio::any_io_executor executor, std::string subject,
                       Clock::duration interval)
    : timer_(std::move(executor)), subject_(std::move(subject)), interval_(interval) {}

void SummaryLog::count(std::string_view kind) {
  const auto now = Clock::now();
  if (counts_.empty()) first_ = now;
  auto it = std::find_if(counts_.begin(), counts_.end(),
                         [&](const auto& entry) { return entry.first == kind; });
  if (it == counts_.end()) {
    counts_.emplace_back(std::string(kind), 1);
  } else {
    ++it->second;
  }
  if (armed_) return;
  armed_ = true;
  // The first line comes at once; later ones wait out the interval since the last.
  timer_.expires_at(std::max(now, last_written_ + interval_));
  timer_.async_wait([weak = weak_from_this()](boost::system::error_code error) {
    auto self = weak.lock();
    if (error || !self) return;
    self->armed_ = false;
    self->flush();
  });
}

void SummaryLog::flush() {
  if (armed_) {
    timer_.cancel();
    armed_ = false;
  }
  if (counts_.empty()) return;
  const auto now = Clock::now();
  std::string what;
  for (const auto& [kind, n] : counts_) {
    what += fmt::format("{}{} x {}", what.empty() ? "" : "; ", n, kind);
  }
  log::warn("{}, last {:.1f} s: {}", subject_, std::chrono::duration<double>(now - first_).count(),
            what);
  counts_.clear();
  last_written_ = now;
}

}  // namespace braid::transport
