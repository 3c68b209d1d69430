// Moving whole store frames over a TCP socket; the bytes are laid out in store_protocol.hpp.
// The server and the client both read through read_frame; the client writes through
// write_frames, the server through its own loop that also returns each frame's bytes to
// its BufferBudget.
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <utility>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "transport/store/store_protocol.hpp"

namespace braid::transport::store_protocol {

// The bytes a server holds at once, across every connection, in frames still arriving and
// replies not yet written. Single-threaded: it lives on the server's executor.
class BufferBudget {
 public:
  explicit BufferBudget(std::size_t limit) noexcept : limit_(limit) {}
  // Takes `bytes` if they fit under the limit; false (taking nothing) if not.
  bool try_take(std::size_t bytes) noexcept {
    if (bytes > limit_ - used_) return false;
    used_ += bytes;
    return true;
  }
  void give_back(std::size_t bytes) noexcept { used_ -= bytes; }
  std::size_t limit() const noexcept { return limit_; }
  std::size_t used() const noexcept { return used_; }

 private:
  std::size_t limit_;
  std::size_t used_ = 0;
};

// Bytes taken from a BufferBudget, given back when the lease is destroyed. A lease without
// a budget takes nothing and always grows.
class BufferLease {
 public:
  BufferLease() = default;
  explicit BufferLease(std::shared_ptr<BufferBudget> budget) : budget_(std::move(budget)) {}
  BufferLease(BufferLease&& other) noexcept
      : budget_(std::move(other.budget_)), bytes_(std::exchange(other.bytes_, 0)) {}
  BufferLease& operator=(BufferLease&& other) noexcept {
    if (this != &other) {
      release();
      budget_ = std::move(other.budget_);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ~BufferLease() { release(); }

  bool grow(std::size_t more) noexcept {
    if (budget_ && !budget_->try_take(more)) return false;
    bytes_ += more;
    return true;
  }

 private:
  void release() noexcept {
    if (budget_) budget_->give_back(std::exchange(bytes_, 0));
  }
  std::shared_ptr<BufferBudget> budget_;
  std::size_t bytes_ = 0;
};

// What one read_frame call may take.
struct ReadLimits {
  std::size_t max_body = kMaxFrameBody;  // the longest frame accepted, prefix excluded
  std::shared_ptr<BufferBudget> budget;  // charged as the frame's buffer grows; null: none
};

// Reads the next frame. nullopt: the peer closed the connection cleanly between frames.
// The frame's buffer grows with the bytes that arrive (doubling, from at most 64 KiB), so
// a length announced and never sent costs at most 64 KiB, and never more than
// `limits.max_body`, which is checked before anything is allocated.
// Throws Error(protocol_error) for a length outside [kHeaderBytes, limits.max_body] or a
// frame cut short by the peer closing, Error(refused) when the budget cannot hold the
// frame's next bytes, and boost::system::system_error for any other socket failure, our
// own close() included.
asio::awaitable<std::optional<Frame>> read_frame(asio::ip::tcp::socket& socket,
                                                 ReadLimits limits = {});

// Writes `queue` front to back until it is empty, frames queued meanwhile included. Asio
// allows one async_write per socket at a time, so each side runs one such writer and
// everything else only pushes to the queue. Throws boost::system::system_error.
asio::awaitable<void> write_frames(asio::ip::tcp::socket& socket, std::deque<Bytes>& queue);

}  // namespace braid::transport::store_protocol
