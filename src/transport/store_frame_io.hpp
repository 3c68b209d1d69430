// Moving whole store frames over a TCP socket; the bytes are laid out in store_protocol.hpp.
// The server and the client both read and write through these two functions.
#pragma once

#include <deque>
#include <optional>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "transport/store_protocol.hpp"

namespace braid::transport::store_protocol {

// Reads the next frame. nullopt: the peer closed the connection cleanly between frames.
// Throws Error(protocol_error) for a length outside the protocol's range (checked before
// anything is allocated) or a frame cut short by the peer closing, and
// boost::system::system_error for any other socket failure, our own close() included.
asio::awaitable<std::optional<Frame>> read_frame(asio::ip::tcp::socket& socket);

// Writes `queue` front to back until it is empty, frames queued meanwhile included. Asio
// allows one async_write per socket at a time, so each side runs one such writer and
// everything else only pushes to the queue. Throws boost::system::system_error.
asio::awaitable<void> write_frames(asio::ip::tcp::socket& socket, std::deque<Bytes>& queue);

}  // namespace braid::transport::store_protocol
