// The rendezvous store: a small TCP key-value service that rank 0 serves and every rank
// uses to find the others (UCX worker addresses, NCCL unique ids, barriers at start-up).
//
//   StoreServer server(runtime, {.port = 0, .token = "secret"});  // rank 0
//   auto store = co_await StoreClient::connect(runtime.executor(), {"127.0.0.1",
//                                              server.port(), "secret"}, deadline);
//   co_await store->set("addr/1", bytes);
//   Bytes peer = co_await store->get("addr/0", deadline);      // waits for the key
//
// Both sides live on a Runtime's io_context; every awaitable resumes on the executor it
// was started from. Errors are braid::Error: Errc::timeout when a deadline passes,
// Errc::refused for a wrong token, Errc::closed / peer_failed when the connection drops,
// Errc::protocol_error for bytes that do not follow the protocol.
//
// The server closes any connection that sends garbage, an oversized or truncated frame,
// or the wrong token, and keeps serving the others.
#pragma once

#include <braid/core/deadline.hpp>
#include <braid/core/runtime.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace braid::transport {

using Bytes = std::vector<std::uint8_t>;

struct StoreAddress {
  std::string host;
  std::uint16_t port = 0;
  std::string token;  // empty: no token
};

class StoreServer {
 public:
  struct Options {
    std::string host = "0.0.0.0";  // interface to listen on
    std::uint16_t port = 0;        // 0: an ephemeral port, see port()
    std::string token;             // empty: any client is accepted
  };

  // Starts listening at once; serves on `runtime`'s thread until destroyed.
  StoreServer(Runtime& runtime, Options options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  std::uint16_t port() const noexcept;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

class StoreClient {
 public:
  // Connects, retrying while the server is not up yet, until `deadline`.
  static asio::awaitable<std::unique_ptr<StoreClient>> connect(asio::any_io_executor executor,
                                                               StoreAddress address,
                                                               Deadline deadline);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  asio::awaitable<void> set(std::string key, Bytes value);
  // Waits until the key exists, then returns its value.
  asio::awaitable<Bytes> get(std::string key, Deadline deadline);
  // Adds `delta` to the integer stored at `key` (absent: 0) and returns the new value.
  asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta);
  // Stores `desired` if the current value equals `expected` (absent counts as equal to
  // an empty `expected`); returns the value stored afterwards either way.
  asio::awaitable<Bytes> compare_set(std::string key, Bytes expected, Bytes desired);
  // Removes the key; true if it existed.
  asio::awaitable<bool> erase(std::string key);
  // Waits until every key exists.
  asio::awaitable<void> wait(std::vector<std::string> keys, Deadline deadline);

 private:
  struct Impl;
  explicit StoreClient(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace braid::transport
