#include "transport/store_frame_io.hpp"

#include <array>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <fmt/format.h>

namespace braid::transport::store_protocol {
namespace {

[[noreturn]] void truncated(std::size_t got, std::size_t want) {
  throw Error(
      Errc::protocol_error,
      fmt::format("the peer closed the connection {} bytes into a {}-byte frame", got, want),
      {.operation = "store.read"});
}

}  // namespace

asio::awaitable<std::optional<Frame>> read_frame(asio::ip::tcp::socket& socket) {
  std::array<std::uint8_t, kLengthBytes> prefix{};
  auto [prefix_error, prefix_read] =
      co_await asio::async_read(socket, asio::buffer(prefix), asio::as_tuple(asio::use_awaitable));
  if (prefix_error == asio::error::eof) {
    if (prefix_read == 0) co_return std::nullopt;
    truncated(prefix_read, kLengthBytes);
  }
  if (prefix_error) throw boost::system::system_error(prefix_error);

  const std::size_t length = decode_length(prefix);
  std::array<std::uint8_t, kHeaderBytes> header{};
  Bytes payload(length - kHeaderBytes);
  // One read for header and payload: the payload lands in its final buffer, no copy.
  const std::array buffers{asio::buffer(header), asio::buffer(payload)};
  auto [body_error, body_read] =
      co_await asio::async_read(socket, buffers, asio::as_tuple(asio::use_awaitable));
  if (body_error == asio::error::eof) truncated(kLengthBytes + body_read, kLengthBytes + length);
  if (body_error) throw boost::system::system_error(body_error);

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
