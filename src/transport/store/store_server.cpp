// The store's server side: an acceptor, one reader coroutine per connection, and the
// replies' way out. What each request does is in store_server_requests.cpp; the state both
// share is in store_server_impl.hpp.
//
// Strangers. The port is open to anyone who can reach it, and everything here shares the
// thread that also does the rank's communication, so a connection earns nothing before
// its hello is accepted: it may send one frame of at most kMaxHelloBody bytes, within
// hello_timeout, and at most max_unauthenticated such connections are kept, the oldest
// closed to admit a new one (a rank sends its hello the moment it connects, so it is never
// the oldest for long, and its client retries if it was). Running out of descriptors
// closes the oldest stranger too, so the accept that failed can succeed. Every frame's
// buffer and every queued reply draws on one BufferBudget of buffer_limit bytes. What
// strangers make the server do is summed up in a warn line per 10 s (SummaryLog).
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <fmt/format.h>

#include <braid/core/log.hpp>
#include <braid/transport/store/store.hpp>

#include "transport/store/store_frame_io.hpp"
#include "transport/store/store_keepalive.hpp"
#include "transport/store/store_protocol.hpp"
#include "transport/store/store_server_impl.hpp"
#include "transport/summary_log.hpp"

namespace braid::transport {
namespace {

using asio::ip::tcp;
using namespace std::chrono_literals;

// After a failed accept the loop pauses this long, doubling up to the cap while accepts
// keep failing: an acceptor with a connection pending stays ready, so without a pause a
// process out of descriptors would spin on it.
constexpr Clock::duration kFirstAcceptPause = 10ms;
constexpr Clock::duration kMaxAcceptPause = 1s;
constexpr Clock::duration kSummaryInterval = 10s;

bool out_of_descriptors(const boost::system::error_code& error) {
  return error == boost::system::errc::too_many_files_open ||
         error == boost::system::errc::too_many_files_open_in_system;
}

}  // namespace

void StoreServer::Impl::start() {
  const std::string where = fmt::format("{}:{}", options_.host, options_.port);
  try {
    // Resolved synchronously: this runs once, and listen hosts are nearly always literals.
    tcp::resolver resolver(acceptor_.get_executor());
    const tcp::endpoint endpoint =
        resolver.resolve(options_.host, std::to_string(options_.port), tcp::resolver::passive)
            .begin()
            ->endpoint();
    acceptor_.open(endpoint.protocol());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    acceptor_.bind(endpoint);
    acceptor_.listen();
  } catch (const boost::system::system_error& e) {
    throw Error(e.code(), fmt::format("cannot listen on {}", where), {.operation = "store.listen"});
  }
  port_ = acceptor_.local_endpoint().port();
  summary_ = std::make_shared<SummaryLog>(acceptor_.get_executor(),
                                          fmt::format("store on port {}", port_), kSummaryInterval);
  log::debug("store: listening on {}:{}{}", options_.host, port_,
             options_.token.empty() ? "" : " (token required)");
  spawn([](Impl& self) { return self.accept_loop(); });
}

void StoreServer::Impl::stop() {
  stopped_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  auto open = std::move(connections_);
  connections_.clear();
  for (const auto& connection : open) close(connection, "the store server is shutting down");
  data_.clear();
  if (summary_) summary_->flush();
}

// Runs `body` as a detached coroutine that keeps this Impl alive until it returns: the
// StoreServer may be gone by then, the coroutines it started finish on their own.
void StoreServer::Impl::spawn(std::function<asio::awaitable<void>(Impl&)> body) {
  asio::co_spawn(
      acceptor_.get_executor(),
      [self = shared_from_this(), body = std::move(body)] { return body(*self); }, asio::detached);
}

asio::awaitable<void> StoreServer::Impl::accept_loop() {
  Clock::duration pause = kFirstAcceptPause;
  while (!stopped_) {
    auto [error, socket] = co_await acceptor_.async_accept(asio::as_tuple(asio::use_awaitable));
    if (stopped_ || error == asio::error::operation_aborted) break;
    if (error) {
      summary_->count(fmt::format("accept failed: {}", error.message()));
      // The oldest stranger's descriptor is the one to give up: then the accept that
      // failed, perhaps a rank's, succeeds.
      if (out_of_descriptors(error) && close_oldest_stranger("the process is out of file "
                                                             "descriptors")) {
        continue;
      }
      asio::steady_timer wait(acceptor_.get_executor(), pause);
      co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
      pause = std::min(pause * 2, kMaxAcceptPause);
      continue;
    }
    pause = kFirstAcceptPause;
    if (strangers_.size() >= options_.max_unauthenticated) {
      close_oldest_stranger(
          fmt::format("over {} connections before hello", options_.max_unauthenticated));
    }
    admit(std::move(socket));
  }
}

void StoreServer::Impl::admit(tcp::socket socket) {
  auto connection = std::make_shared<Connection>(std::move(socket), acceptor_.get_executor());
  boost::system::error_code ignored;
  connection->socket.set_option(tcp::no_delay(true), ignored);
  detail::give_up_on_silence(connection->socket);
  const auto remote = connection->socket.remote_endpoint(ignored);
  connection->peer = fmt::format("{}:{}", remote.address().to_string(), remote.port());
  log::debug("store: port {} accepted a connection from {}", port_, connection->peer);
  connections_.insert(connection);
  strangers_.push_back(connection);
  connection->hello_expiry.expires_after(options_.hello_timeout);
  connection->hello_expiry.async_wait(
      [self = shared_from_this(), weak = std::weak_ptr(connection)](boost::system::error_code e) {
        auto late = weak.lock();
        if (e || !late || late->authenticated || !late->open) return;
        const double seconds = std::chrono::duration<double>(self->options_.hello_timeout).count();
        self->summary_->count(fmt::format("closed before hello: none within {:.3g} s", seconds));
        self->close(late, "no hello within the hello timeout");
      });
  spawn([connection](Impl& self) { return self.serve(connection); });
}

bool StoreServer::Impl::close_oldest_stranger(std::string_view why) {
  if (strangers_.empty()) return false;
  const std::shared_ptr<Connection> oldest = strangers_.front();
  summary_->count(fmt::format("closed before hello: the oldest, {}", why));
  close(oldest, fmt::format("closed as the oldest connection before hello: {}", why));
  return true;
}

void StoreServer::Impl::authenticate(const std::shared_ptr<Connection>& connection) {
  connection->authenticated = true;
  connection->hello_expiry.cancel();
  std::erase(strangers_, connection);
}

asio::awaitable<void> StoreServer::Impl::serve(std::shared_ptr<Connection> connection) {
  std::string reason = "the client closed the connection";
  std::uint64_t request_id = 0;  // echoed in a protocol_error reply where one was read
  std::error_code violated;
  try {
    while (connection->open && !connection->close_after_flush) {
      // A stranger may send its hello and nothing bigger; a client may send any frame the
      // protocol allows, drawing on the budget as its bytes arrive.
      proto::ReadLimits limits{
          .max_body = connection->authenticated ? proto::kMaxFrameBody : proto::kMaxHelloBody,
          .budget = budget_};
      std::optional<proto::Frame> frame = co_await proto::read_frame(connection->socket, limits);
      if (!frame) break;
      request_id = frame->request_id;
      handle(connection, std::move(*frame));
    }
  } catch (const Error& e) {
    // Bytes that do not follow the protocol, or a frame the budget cannot hold: say why,
    // then drop this connection only.
    reason = e.detail();
    violated = e.code();
  } catch (const boost::system::system_error& e) {
    reason = e.code().message();
  }
  if (violated) {
    if (!connection->authenticated) {
      summary_->count("closed before hello: broke the protocol");
    } else if (violated == Errc::refused) {
      summary_->count(fmt::format("closed: a frame would take the store's buffers past {} MiB",
                                  options_.buffer_limit >> 20));
    }
    const Errc code = violated == Errc::refused ? Errc::refused : Errc::protocol_error;
    send(connection, proto::encode_error(request_id, code, reason));
    drop_after_flush(connection, fmt::format("{}: {}", violated.message(), reason));
  } else if (!connection->close_after_flush) {
    close(connection, reason);
  }
}

asio::awaitable<void> StoreServer::Impl::flush(std::shared_ptr<Connection> connection) {
  std::string failure;
  try {
    // Not proto::write_frames: each frame's lease goes back as the frame leaves.
    while (!connection->outbox.empty()) {
      co_await asio::async_write(connection->socket, asio::buffer(connection->outbox.front().frame),
                                 asio::use_awaitable);
      connection->outbox.pop_front();
    }
  } catch (const boost::system::system_error& e) {
    failure = e.code().message();
    connection->outbox.clear();  // nothing more will leave; the budget gets its share back
  }
  connection->writing = false;
  if (!failure.empty()) {
    close(connection, "write failed: " + failure);
  } else if (connection->close_after_flush) {
    close(connection, *connection->close_after_flush);
  }
}

void StoreServer::Impl::handle(const std::shared_ptr<Connection>& connection, proto::Frame frame) {
  proto::Request request = proto::decode_request(frame);
  const bool hello = std::holds_alternative<proto::HelloRequest>(request);
  if (hello == connection->authenticated) {
    throw Error(Errc::protocol_error,
                hello ? "a second hello on one connection"
                      : fmt::format("{} before hello", proto::to_string(frame.opcode)),
                {.operation = "store.serve"});
  }
  std::visit([&](auto& r) { on_request(connection, frame.request_id, std::move(r)); }, request);
}

void StoreServer::Impl::send(const std::shared_ptr<Connection>& connection, Bytes frame) {
  if (!connection->open) return;
  proto::BufferLease lease(budget_);
  if (!lease.grow(frame.size())) {
    // A client that asks for more than it reads, or many that each ask for a large value
    // at once.
    summary_->count(fmt::format("closed: replies would take the store's buffers past {} MiB",
                                options_.buffer_limit >> 20));
    if (!connection->close_after_flush) {
      drop_after_flush(connection, "its replies would take the store's buffers past their limit");
    }
    return;
  }
  connection->outbox.push_back(Outgoing{std::move(frame), std::move(lease)});
  if (connection->writing) return;
  connection->writing = true;
  spawn([connection](Impl& self) { return self.flush(connection); });
}

void StoreServer::Impl::drop_after_flush(const std::shared_ptr<Connection>& connection,
                                         std::string reason) {
  if (!connection->writing) {
    close(connection, reason);
  } else {
    connection->close_after_flush = std::move(reason);
  }
}

void StoreServer::Impl::close(const std::shared_ptr<Connection>& connection,
                              std::string_view reason) {
  if (!connection->open) return;
  connection->open = false;
  log::debug("store: port {} closed the connection from {}: {}", port_, connection->peer, reason);
  boost::system::error_code ignored;
  connection->socket.shutdown(tcp::socket::shutdown_both, ignored);
  connection->socket.close(ignored);
  connection->hello_expiry.cancel();
  if (!connection->authenticated) std::erase(strangers_, connection);
  for (const std::shared_ptr<Waiter>& waiter : connection->waiters) {
    unpark(waiter);
    waiter->connection.reset();
  }
  connection->waiters.clear();
  connections_.erase(connection);
  // A server shutting down is not its clients failing.
  if (connection->will && !stopped_) {
    auto [key, value, appended] = std::move(*connection->will);
    connection->will.reset();
    if (appended) {
      log::debug("store: appending the will of {} to the log at '{}'", connection->peer, key);
      if (!append(key, std::move(value))) {
        log::warn("store: the will of {} names '{}', which holds no log; dropped", connection->peer,
                  key);
      }
    } else if (data_.contains(key)) {
      log::debug("store: will of {} for key '{}' not stored: the key already exists",
                 connection->peer, key);
    } else {
      log::debug("store: storing the will of {} under key '{}'", connection->peer, key);
      store(key, std::move(value));
    }
  }
}

StoreServer::StoreServer(Runtime& runtime, Options options)
    : impl_(std::make_shared<Impl>(runtime, std::move(options))) {
  runtime.run([this] { impl_->start(); });
}

StoreServer::~StoreServer() {
  impl_->runtime_.run([this] { impl_->stop(); });
}

std::uint16_t StoreServer::port() const noexcept {
  return impl_->port_;
}

}  // namespace braid::transport
