// StoreServer's state, private to the server: its connections, the key-value map and the
// waiters parked on missing keys. store_server.cpp admits connections and moves their
// frames; store_server_requests.cpp carries out each request on the map, the waiters and
// the wills. Everything runs on the Runtime's progress thread, so nothing here takes a
// lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <braid/core/runtime.hpp>
#include <braid/transport/store/store.hpp>

#include "transport/store/store_frame_io.hpp"
#include "transport/store/store_protocol.hpp"
#include "transport/summary_log.hpp"

namespace braid::transport {

namespace proto = store_protocol;

struct StoreServer::Impl : std::enable_shared_from_this<StoreServer::Impl> {
  struct Connection;

  // A get or wait parked until its missing keys appear.
  struct Waiter {
    Waiter(std::shared_ptr<Connection> c, std::uint64_t id, asio::any_io_executor executor)
        : connection(std::move(c)), request_id(id), expiry(std::move(executor)) {}

    std::shared_ptr<Connection> connection;  // reset once answered or dropped
    std::uint64_t request_id;
    std::optional<std::string> value_key;  // a get replies with this key's value
    std::vector<std::string> missing;      // the waiter is listed under each of these keys
    asio::steady_timer expiry;
  };

  // A reply waiting to be written, and its share of the server's BufferBudget.
  struct Outgoing {
    Bytes frame;
    proto::BufferLease lease;
  };

  struct Connection {
    Connection(asio::ip::tcp::socket s, const asio::any_io_executor& executor)
        : socket(std::move(s)), hello_expiry(executor) {}

    asio::ip::tcp::socket socket;
    std::string peer;
    bool authenticated = false;
    bool open = true;
    bool writing = false;
    std::optional<std::string> close_after_flush;  // the reason, once the peer is to be dropped
    std::deque<Outgoing> outbox;
    asio::steady_timer hello_expiry;  // closes the connection if no hello is accepted first
    std::vector<std::shared_ptr<Waiter>> waiters;
    // Stored when the connection closes, unless withdrawn first (store_protocol.hpp, Wills).
    std::optional<proto::SetWillRequest> will;
  };

  Impl(Runtime& runtime, Options options)
      : runtime_(runtime),
        options_(std::move(options)),
        acceptor_(runtime.executor()),
        budget_(std::make_shared<proto::BufferBudget>(options_.buffer_limit)) {}

  void start();
  void stop();

  asio::awaitable<void> accept_loop();
  void admit(asio::ip::tcp::socket socket);
  bool close_oldest_stranger(std::string_view why);
  void authenticate(const std::shared_ptr<Connection>& connection);
  asio::awaitable<void> serve(std::shared_ptr<Connection> connection);
  asio::awaitable<void> flush(std::shared_ptr<Connection> connection);
  void spawn(std::function<asio::awaitable<void>(Impl&)> body);

  void handle(const std::shared_ptr<Connection>& connection, proto::Frame frame);
  void on_request(const std::shared_ptr<Connection>& c, std::uint64_t id, proto::HelloRequest r);
  void on_request(const std::shared_ptr<Connection>& c, std::uint64_t id, proto::SetRequest r);
  void on_request(const std::shared_ptr<Connection>& c, std::uint64_t id, proto::GetRequest r);
  void on_request(const std::shared_ptr<Connection>& c, std::uint64_t id, proto::AddRequest r);
  void on_request(const std::shared_ptr<Connection>& c, std::uint64_t id,
                  proto::CompareSetRequest r);
  void on_request(const std::shared_ptr<Connection>& c, std::uint64_t id, proto::EraseRequest r);
  void on_request(const std::shared_ptr<Connection>& c, std::uint64_t id, proto::WaitRequest r);
  void on_request(const std::shared_ptr<Connection>& c, std::uint64_t id, proto::SetWillRequest r);
  void on_request(const std::shared_ptr<Connection>& c, std::uint64_t id, proto::AppendRequest r);
  void on_request(const std::shared_ptr<Connection>& c, std::uint64_t id,
                  proto::ClearWillRequest r);

  void store(const std::string& key, Bytes value);
  // The counter at `key` (absent: 0), or nullopt when the key holds something else.
  std::optional<std::int64_t> counter_at(const std::string& key) const;
  // Appends `value` to the log at `key` (store_protocol.hpp, Logs) and returns its index;
  // nullopt, storing nothing, when the key holds something that is not a count.
  std::optional<std::int64_t> append(const std::string& key, Bytes value);
  void park(const std::shared_ptr<Connection>& connection, std::uint64_t id,
            std::vector<std::string> missing, std::optional<std::string> value_key,
            std::chrono::milliseconds timeout);
  void unpark(const std::shared_ptr<Waiter>& waiter);
  void expire(const std::shared_ptr<Waiter>& waiter);

  void send(const std::shared_ptr<Connection>& connection, Bytes frame);
  void drop_after_flush(const std::shared_ptr<Connection>& connection, std::string reason);
  void close(const std::shared_ptr<Connection>& connection, std::string_view reason);

  Runtime& runtime_;
  const Options options_;
  asio::ip::tcp::acceptor acceptor_;
  std::uint16_t port_ = 0;
  bool stopped_ = false;
  std::unordered_map<std::string, Bytes> data_;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiters_by_key_;
  std::unordered_set<std::shared_ptr<Connection>> connections_;
  // Connections whose hello is not accepted yet, oldest first.
  std::deque<std::shared_ptr<Connection>> strangers_;
  std::shared_ptr<proto::BufferBudget> budget_;
  std::shared_ptr<SummaryLog> summary_;  // from start(), when the port is known
};

}  // namespace braid::transport
