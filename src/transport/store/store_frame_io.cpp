#include "transport/store/store_frame_io.hpp"

#include <algorithm>
#include <array>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <fmt/format.h>

namespace braid::transport::store_protocol {
namespace {

// A frame's buffer starts at this size (or the frame's, if smaller) and then doubles as
// bytes arrive: what a length costs before its bytes come is bounded by this, and a large
// frame is copied O(1) times per byte on the way.
constexpr std::size_t kFirstChunk = std::size_t{64} << 10;

[[noreturn]] void truncated(std::size_t got, std::size_t want) {
  throw Error(
      Errc::protocol_error,
      fmt::format("the peer closed the connection {} bytes into a {}-byte frame", got, want),
      {.operation = "store.read"});
}

void grow(BufferLease& lease, const ReadLimits& limits, std::size_t more, std::size_t length) {
  if (lease.grow(more)) return;
  throw Error(Errc::refused,
              fmt::format("the store's buffers are full ({} of {} bytes held across its "
                          "connections), so this {}-byte frame cannot be read",
                          limits.budget->used(), limits.budget->limit(), length),
              {.operation = "store.read"});
}

}  // namespace

asio::awaitable<std::optional<Frame>> read_frame(asio::ip::tcp::socket& socket, ReadLimits limits) {
  std::array<std::uint8_t, kLengthBytes> prefix{};
  auto [prefix_error, prefix_read] =
      co_await asio::async_read(socket, asio::buffer(prefix), asio::as_tuple(asio::use_awaitable));
  if (prefix_error == asio::error::eof) {
    if (prefix_read == 0) co_return std::nullopt;
    truncated(prefix_read, kLengthBytes);
  }
  if (prefix_error) throw boost::system::system_error(prefix_error);

  const std::size_t length = decode_length(prefix);
  if (length > limits.max_body) {
    throw Error(Errc::protocol_error,
                fmt::format("frame length {} is over the {} bytes this connection may send now",
                            length, limits.max_body),
                {.operation = "store.read"});
  }
  const std::size_t body = length - kHeaderBytes;
  BufferLease lease(limits.budget);
  std::size_t have = std::min(body, kFirstChunk);
  grow(lease, limits, kHeaderBytes + have, length);
  std::array<std::uint8_t, kHeaderBytes> header{};
  Bytes payload(have);
  // The header and the first chunk in one read; the payload lands in its final buffer.
  const std::array buffers{asio::buffer(header), asio::buffer(payload)};
  auto [first_error, first_read] =
      co_await asio::async_read(socket, buffers, asio::as_tuple(asio::use_awaitable));
  if (first_error == asio::error::eof) truncated(kLengthBytes + first_read, kLengthBytes + length);
  if (first_error) throw boost::system::system_error(first_error);

  while (have < body) {
    const std::size_t next = std::min(body, 2 * have);
    grow(lease, limits, next - have, length);
    payload.resize(next);
    auto [error, read] =
        co_await asio::async_read(socket, asio::buffer(payload.data() + have, next - have),
                                  asio::as_tuple(asio::use_awaitable));
    if (error == asio::error::eof) {
      truncated(kLengthBytes + kHeaderBytes + have + read, kLengthBytes + length);
    }
    if (error) throw boost::system::system_error(error);
    have = next;
  }

  Frame frame = decode_header(header);
  frame.payload = std::move(payload);
  co_return frame;
}

asio::awaitable<void> write_frames(asio::ip::tcp::socket& socket, std::deque<Bytes>& queue) {
  while (!queue.empty()) {
    co_await asio::async_write(socket, asio::buffer(queue.front()), asio::use_awaitable);
    queue.pop_front();
  }
}

}  // namespace braid::transport::store_protocol
