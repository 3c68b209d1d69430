// The rendezvous store: a small TCP key-value service that node 0's braid-run (or, under
// other launchers, rank 0) serves and every rank uses to find the others (UCX worker
// addresses, NCCL unique ids, barriers at start-up). A StoreClient may instead use an etcd
// cluster (StoreAddress::etcd_members; BRAID_STORE=etcd://...), with the same operations and
// guarantees, so that the store outlives any one machine; what differs is said below.
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
// or the wrong token, and keeps serving the others. A frame (and so a value) is capped at
// 64 MiB; the wire format is described in src/transport/store_protocol.hpp.
//
// Strangers cannot make the server hold much: before its hello is accepted a connection
// may send one frame of at most 4 KiB, and must do so within Options::hello_timeout; at
// most Options::max_unauthenticated such connections are kept (one more closes the oldest,
// so a rank connecting now always gets in); buffers grow with the bytes that arrive, never
// with a length only announced, and all of them together stay under Options::buffer_limit.
// What this does and does not protect: docs/user-guide.md, "What the store guarantees".
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <braid/core/deadline.hpp>
#include <braid/core/runtime.hpp>

namespace braid::transport {

using Bytes = std::vector<std::uint8_t>;

struct StoreAddress {
  std::string host;
  std::uint16_t port = 0;
  std::string token;  // empty: no token
  // Put before every key this client names, as PyTorch's PrefixStore does: one store then
  // holds many namespaces (braid-run gives each generation of a restarting job its own,
  // "braid/run/g/3/"). Errors name the whole key.
  std::string key_prefix;
  // Not empty: the store is an etcd cluster (BRAID_STORE=etcd://...) reached at any of these
  // members ("host:port", tried in turn), and host, port and token are unused. Every key
  // lies under etcd_namespace there, so one cluster serves many jobs.
  std::vector<std::string> etcd_members;
  std::string etcd_namespace;
};

class StoreServer {
 public:
  struct Options {
    std::string host = "0.0.0.0";  // interface to listen on
    std::uint16_t port = 0;        // 0: an ephemeral port, see port()
    std::string token;             // empty: any client is accepted
    // A connection whose hello has not been accepted this long after it was accepted is
    // closed. Clients send their hello at once, so only a stranger or a stalled peer waits.
    std::chrono::milliseconds hello_timeout = std::chrono::seconds(5);
    // Connections accepted whose hello is not accepted yet; one more closes the oldest.
    std::size_t max_unauthenticated = 64;
    // Bytes held at once across all connections in frames still arriving and replies not
    // yet written; a connection that would take the total past it is closed.
    std::size_t buffer_limit = std::size_t{256} << 20;
  };

  // Starts listening at once; serves on `runtime`'s thread until destroyed. Throws Error
  // (operation "store.listen") when the address cannot be bound. Destroying the server
  // closes every connection: clients' pending operations fail with Errc::peer_failed.
  // Construct and destroy it off the runtime thread or on it; both work.
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
  // Connects, retrying with a short backoff while the server is not up yet (ranks start in
  // any order), until `deadline`: then Errc::timeout naming host:port. A wrong or missing
  // token is Errc::refused at once. The client's state lives on `executor`, which must not
  // run handlers on two threads at once (a Runtime's executor, or a strand).
  static asio::awaitable<std::unique_ptr<StoreClient>> connect(asio::any_io_executor executor,
                                                               StoreAddress address,
                                                               Deadline deadline);
  // Operations still pending fail with Errc::closed.
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // Any number of operations may be outstanding at once, from any coroutines; each
  // waits for its own reply. Operations without a deadline argument wait for their reply
  // until the default deadline (BRAID_TIMEOUT). If the connection drops, every pending
  // and later operation fails with Errc::peer_failed naming the store's host:port.

  asio::awaitable<void> set(std::string key, Bytes value);
  // Waits until the key exists, then returns its value; Errc::timeout naming the key at
  // `deadline`.
  asio::awaitable<Bytes> get(std::string key, Deadline deadline);
  // Adds `delta` to the integer stored at `key` (absent: 0) and returns the new value.
  // Counters are stored as decimal text ("42"), so get() of a counter reads naturally;
  // Errc::invalid_argument if the key holds something else or the sum overflows.
  asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta);
  // Stores `desired` if the current value equals `expected` (absent counts as equal to
  // an empty `expected`); returns the value stored afterwards either way (empty if the
  // key stays absent).
  asio::awaitable<Bytes> compare_set(std::string key, Bytes expected, Bytes desired);
  // Appends `value` to the log at `key` and returns its index (0 for the first entry). The
  // key holds the number of entries as decimal text (a counter, for add() and get()) and
  // entry i is the key "<key>/<i>": a reader follows the log with get("<key>/0"), then
  // "<key>/1", each waiting until the entry exists. Errc::invalid_argument if the key
  // holds something other than a count.
  asio::awaitable<std::int64_t> append(std::string key, Bytes value);
  // Removes the key; true if it existed.
  asio::awaitable<bool> erase(std::string key);
  // Waits until every key exists; Errc::timeout naming the keys at `deadline`.
  asio::awaitable<void> wait(std::vector<std::string> keys, Deadline deadline);

  // A last will: when this client's connection closes while a will is registered -- the
  // process exited or was killed, the client was destroyed, the network dropped it --
  // (on etcd: once the client's lease runs out, BRAID_ETCD_TTL after its process stopped
  // renewing it, or at once when the client is destroyed) the server sets `key` to
  // `value`, waking get()/wait() callers on it like any set. If `key` already exists then, the
  // server keeps the value it has: the first will to fire wins (several ranks sharing one failure
  // key report the first death). One will per client; a second set_will replaces the first. The
  // will is the server's to fire, so a server that itself goes away fires nothing: clients see
  // their own Errc::peer_failed. Completes once the server has registered it.
  asio::awaitable<void> set_will(std::string key, Bytes value);
  // As set_will, but the will's value is appended to the log at `key` (see append()), so
  // every will that fires is kept, in the order they fired.
  asio::awaitable<void> set_appending_will(std::string key, Bytes value);
  // Withdraws the will, so that closing the client afterwards sets nothing. Completes
  // once the server has withdrawn it; no-op without a will.
  asio::awaitable<void> clear_will();

 private:
  struct Impl;
  StoreClient(std::shared_ptr<Impl> impl, std::string key_prefix);
  std::shared_ptr<Impl> impl_;
  const std::string key_prefix_;  // StoreAddress::key_prefix
};

}  // namespace braid::transport
