// An etcd cluster as braid reaches it: the v3 API's JSON gateway (grpc-gateway, served on
// every member's client port since etcd 3.3), over HTTP/1.1 with Boost.Beast. Keys and
// values travel in base64 and 64-bit integers as decimal strings; a watch is one POST whose
// reply streams one JSON message per line. The gateway is part of etcd itself, so braid
// needs no gRPC library, only Beast (in Boost) and nlohmann's JSON header.
//
// Any member answers any request (etcd forwards writes to its leader), so the gateway
// tries the members in turn, starting with the last that answered. The cluster counts as
// lost once no member has answered for BRAID_NETWORK_TIMEOUT: a request that finds none
// for that long fails with Errc::peer_failed naming every member and its last failure.
//
// Cost: one HTTP request per call, on a kept-alive connection (a few hundred microseconds
// on one machine); a watch holds a connection of its own while it lasts.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <braid/core/deadline.hpp>
#include <braid/transport/store/store.hpp>

namespace braid::transport::etcd {

using Json = nlohmann::json;

// etcd's JSON carries keys and values in base64.
std::string base64(std::string_view bytes);
std::string base64(const Bytes& bytes);
// Throws Error(Errc::protocol_error) for text that is not base64.
Bytes unbase64(std::string_view text);
// A 64-bit integer field ("revision": "42"); absent (protobuf leaves out zeros): 0.
std::int64_t int_field(const Json& object, std::string_view name);

// One watch: POST /v3/watch, then its messages as they arrive.
class WatchStream {
 public:
  struct Connection;
  explicit WatchStream(std::shared_ptr<Connection> connection);
  ~WatchStream();
  WatchStream(const WatchStream&) = delete;
  WatchStream& operator=(const WatchStream&) = delete;

  // The next message's "result" object; nullopt once the stream has ended (the member
  // went away, close() or the gateway's close). Errc::protocol_error for a line that is
  // not a watch message.
  asio::awaitable<std::optional<Json>> next();
  // Ends the stream: a next() waiting returns nullopt.
  void close();

 private:
  std::shared_ptr<Connection> connection_;
};

class Gateway : public std::enable_shared_from_this<Gateway> {
 public:
  // `members`: "host:port" each; Errc::invalid_environment for one that is not.
  Gateway(asio::any_io_executor executor, std::vector<std::string> members);
  ~Gateway();

  // "etcd://198.18.0.1:2379,198.18.0.2:2379": for messages.
  const std::string& where() const noexcept { return where_; }

  // POSTs `body` to `path` ("/v3/kv/range") and returns the reply. A request whose reply is
  // lost is sent again, to the next member: callers make their requests idempotent.
  // Errc::peer_failed as above (or at `deadline`, if sooner), Errc::closed after close(),
  // Errc::invalid_argument for a request etcd refuses (its words), Errc::protocol_error for
  // a reply that is not JSON.
  asio::awaitable<Json> post(std::string path, Json body, Deadline deadline);

  // Opens a watch with `create_request` (etcd's WatchCreateRequest) on the first member that
  // takes it, and returns it once etcd has said it is created. Errors as post().
  asio::awaitable<std::unique_ptr<WatchStream>> watch(Json create_request, Deadline deadline);

  // Closes every connection, idle or in use: what waits on one fails with Errc::closed,
  // and so does every later call.
  void close();

 private:
  struct Pool;
  // Calls `attempt(member, attempt_deadline, failure)` on one member after another, from the
  // one that answered last, until it returns a result. An attempt that returns nullopt
  // says why in `failure` (or leaves it empty to be tried again at once: an idle
  // connection the member had closed); one that throws boost::system::system_error failed
  // with its words.
  template <class T, class Attempt>
  asio::awaitable<T> with_failover(std::string what, Deadline deadline, Attempt attempt);
  asio::awaitable<std::shared_ptr<WatchStream::Connection>> open(std::size_t member,
                                                                 Deadline deadline);
  // Throws peer_failed once no member has answered for the network timeout.
  void give_up_if_lost(Clock::time_point first_failure, Deadline deadline,
                       const std::vector<std::string>& failures, const std::string& what) const;
  std::string member_name(std::size_t member) const;

  asio::any_io_executor executor_;
  std::vector<std::pair<std::string, std::uint16_t>> members_;
  std::string where_;
  std::size_t current_ = 0;  // the member that answered last
  std::shared_ptr<Pool> pool_;
};

}  // namespace braid::transport::etcd
