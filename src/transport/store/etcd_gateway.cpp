#include "transport/store/etcd_gateway.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <optional>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/core/log.hpp>
#include <braid/transport/bootstrap.hpp>

#include "transport/store/store_keepalive.hpp"
#include "transport/store/store_time.hpp"

namespace braid::transport::etcd {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
using namespace std::chrono_literals;

// One request to one member takes at most this long before the next member is tried: a
// healthy cluster answers in milliseconds, and a leader election (etcd's default election
// timeout is 1 s) in about a second.
constexpr Clock::duration kAttemptTimeout = 3s;
// After every member failed in a row, the next round starts after this pause, doubling up
// to the cap: a cluster electing a leader comes back within a second or two.
constexpr Clock::duration kFirstRoundPause = 20ms;
constexpr Clock::duration kMaxRoundPause = 500ms;

constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

Clock::duration network_timeout() {
  const auto timeout = config::seconds_value("BRAID_NETWORK_TIMEOUT");
  // 0 means TCP's own elsewhere; here it means the request's own deadline alone.
  return timeout.count() <= 0 ? Clock::duration::max() / 2
                              : std::chrono::duration_cast<Clock::duration>(timeout);
}

// etcd's (grpc-gateway's) error reply: {"error": "...", "code": 3, "message": "..."}.
std::string error_text(const Json& reply) {
  if (reply.is_object()) {
    for (const char* field : {"message", "error"}) {
      auto it = reply.find(field);
      if (it != reply.end() && it->is_string()) return it->get<std::string>();
    }
  }
  return reply.dump();
}

// gRPC codes etcd answers while it cannot serve for now (no leader, a member stopping,
// a deadline inside the cluster): another member, or the same one later, may.
bool passing_trouble(const Json& reply) {
  if (!reply.is_object()) return false;
  const std::int64_t code = int_field(reply, "code");
  return code == 4 /*deadline exceeded*/ || code == 14 /*unavailable*/ || code == 10 /*aborted*/;
}

}  // namespace

std::string base64(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const std::uint32_t n = static_cast<std::uint8_t>(bytes[i]) << 16 |
                            static_cast<std::uint8_t>(bytes[i + 1]) << 8 |
                            static_cast<std::uint8_t>(bytes[i + 2]);
    for (int shift : {18, 12, 6, 0}) out += kAlphabet[(n >> shift) & 63];
  }
  if (const std::size_t rest = bytes.size() - i; rest > 0) {
    std::uint32_t n = static_cast<std::uint8_t>(bytes[i]) << 16;
    if (rest == 2) n |= static_cast<std::uint8_t>(bytes[i + 1]) << 8;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += rest == 2 ? kAlphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64(const Bytes& bytes) {
  return base64(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

Bytes unbase64(std::string_view text) {
  auto bad = [&] {
    return Error(Errc::protocol_error,
                 fmt::format("etcd sent '{}', which is not base64", text.substr(0, 64)));
  };
  if (text.size() % 4 != 0) throw bad();
  Bytes out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    std::uint32_t n = 0;
    int padding = 0;
    for (std::size_t j = 0; j < 4; ++j) {
      const char c = text[i + j];
      std::uint32_t sextet = 0;
      if (c == '=' && i + 4 == text.size() && j >= 2) {
        ++padding;
      } else {
        const auto at = kAlphabet.find(c);
        if (at == std::string_view::npos || padding > 0) throw bad();
        sextet = static_cast<std::uint32_t>(at);
      }
      n = n << 6 | sextet;
    }
    out.push_back(static_cast<std::uint8_t>(n >> 16));
    if (padding < 2) out.push_back(static_cast<std::uint8_t>(n >> 8));
    if (padding < 1) out.push_back(static_cast<std::uint8_t>(n));
  }
  return out;
}

std::int64_t int_field(const Json& object, std::string_view name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_string()) {
    const std::string& text = it->get_ref<const std::string&>();
    std::int64_t value = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error == std::errc() && end == text.data() + text.size()) return value;
  }
  throw Error(Errc::protocol_error,
              fmt::format("etcd's field '{}' holds {}, not an integer", name, it->dump()));
}

// A connection to one member: kept alive between requests, or carrying one watch.
struct WatchStream::Connection {
  explicit Connection(const asio::any_io_executor& executor, std::size_t member)
      : stream(executor), member(member) {}

  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  std::size_t member;
  // A watch's reply, read as it streams in, and how much of its body has been handed out.
  std::optional<http::response_parser<http::string_body>> watch;
  std::size_t consumed = 0;
};

// Idle connections, and every connection open, so that close() reaches them all.
struct Gateway::Pool {
  std::vector<std::shared_ptr<WatchStream::Connection>> idle;
  std::vector<std::weak_ptr<WatchStream::Connection>> open;
  bool closed = false;

  void forget_expired() {
    std::erase_if(open, [](const auto& weak) { return weak.expired(); });
  }
};

WatchStream::WatchStream(std::shared_ptr<Connection> connection)
    : connection_(std::move(connection)) {}

WatchStream::~WatchStream() {
  close();
}

void WatchStream::close() {
  beast::error_code ignored;
  connection_->stream.socket().close(ignored);
}

asio::awaitable<std::optional<Json>> WatchStream::next() {
  auto connection = connection_;  // the stream may be closed (not freed) while this waits
  auto& parser = *connection->watch;
  for (;;) {
    std::string& body = parser.get().body();
    const auto end = body.find('\n', connection->consumed);
    if (end != std::string::npos) {
      const std::string_view line(body.data() + connection->consumed, end - connection->consumed);
      connection->consumed = end + 1;
      if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
      Json message = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      // Handed-out lines are dropped once they are most of the body.
      if (connection->consumed > body.size() / 2) {
        body.erase(0, connection->consumed);
        connection->consumed = 0;
      }
      if (message.is_discarded() || !message.is_object()) {
        throw Error(Errc::protocol_error,
                    fmt::format("etcd sent a watch message that is not JSON: {}",
                                std::string(line.substr(0, 200))));
      }
      if (auto result = message.find("result"); result != message.end()) co_return *result;
      // {"error": ...}: the watch ended on etcd's side.
      log::debug("etcd watch ended: {}", message.dump());
      co_return std::nullopt;
    }
    if (parser.is_done()) co_return std::nullopt;
    auto [error, n] = co_await http::async_read_some(connection->stream, connection->buffer, parser,
                                                     asio::as_tuple(asio::use_awaitable));
    if (error) co_return std::nullopt;
  }
}

Gateway::Gateway(asio::any_io_executor executor, std::vector<std::string> members)
    : executor_(std::move(executor)), pool_(std::make_shared<Pool>()) {
  std::string listed;
  for (const std::string& member : members) {
    HostPort at = parse_host_port(member, "an etcd member");
    members_.emplace_back(std::move(at.host), at.port);
    listed += fmt::format("{}{}", listed.empty() ? "" : ",", member);
  }
  if (members_.empty()) {
    throw Error(Errc::invalid_environment, "an etcd store needs at least one member");
  }
  where_ = fmt::format("etcd://{}", listed);
}

std::string Gateway::member_name(std::size_t member) const {
  return format_host_port(members_[member].first, members_[member].second);
}

Gateway::~Gateway() {
  close();
}

void Gateway::close() {
  pool_->closed = true;
  pool_->idle.clear();
  for (const auto& weak : pool_->open) {
    if (auto connection = weak.lock()) {
      beast::error_code ignored;
      connection->stream.socket().close(ignored);
    }
  }
  pool_->open.clear();
}

asio::awaitable<std::shared_ptr<WatchStream::Connection>> Gateway::open(std::size_t member,
                                                                        Deadline deadline) {
  const auto& [host, port] = members_[member];
  tcp::resolver resolver(executor_);
  auto [resolve_error, endpoints] = co_await resolver.async_resolve(
      host, std::to_string(port), asio::as_tuple(asio::use_awaitable));
  if (resolve_error) throw beast::system_error(resolve_error);
  auto connection = std::make_shared<WatchStream::Connection>(executor_, member);
  pool_->forget_expired();
  pool_->open.push_back(connection);
  connection->stream.expires_at(deadline);
  co_await connection->stream.async_connect(endpoints, asio::use_awaitable);
  log::debug("{}: connected to {}", where_, member_name(member));
  connection->stream.expires_never();
  boost::system::error_code ignored;
  connection->stream.socket().set_option(tcp::no_delay(true), ignored);
  // A member whose machine vanished says nothing; the kernel gives up on it as it does
  // for braid's own store (store_keepalive.hpp).
  detail::give_up_on_silence(connection->stream.socket());
  co_return connection;
}

void Gateway::give_up_if_lost(Clock::time_point first_failure, Deadline deadline,
                              const std::vector<std::string>& failures,
                              const std::string& what) const {
  const auto now = Clock::now();
  if (now < deadline && now - first_failure < network_timeout()) return;
  std::string named;
  for (std::size_t m = 0; m < members_.size(); ++m) {
    if (failures[m].empty()) continue;
    named += fmt::format("{}{}: {}", named.empty() ? "" : "; ", member_name(m), failures[m]);
  }
  throw Error(Errc::peer_failed,
              fmt::format("no member of the store at {} answered {} within {:.3f}s ({})", where_,
                          what, seconds(now - first_failure), named));
}

template <class T, class Attempt>
asio::awaitable<T> Gateway::with_failover(std::string what, Deadline deadline, Attempt attempt) {
  auto self = shared_from_this();
  auto pool = pool_;
  auto closed = [&] {
    return Error(Errc::closed, fmt::format("the client of the store at {} was closed", where_));
  };
  std::vector<std::string> failures(members_.size());
  std::optional<Clock::time_point> first_failure;
  Clock::duration pause = kFirstRoundPause;
  std::size_t failed_in_a_row = 0;
  for (;;) {
    if (pool->closed) throw closed();
    if (first_failure) give_up_if_lost(*first_failure, deadline, failures, what);
    if (failed_in_a_row == members_.size()) {
      failed_in_a_row = 0;
      asio::steady_timer wait(executor_, std::min(Clock::now() + pause, deadline));
      co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
      pause = std::min(pause * 2, kMaxRoundPause);
      continue;
    }
    const std::size_t member = current_;
    std::string failure;
    try {
      std::optional<T> result =
          co_await attempt(member, std::min(deadline, Clock::now() + kAttemptTimeout), failure);
      if (result) co_return std::move(*result);
    } catch (const boost::system::system_error& e) {
      failure = e.code() == beast::error::timeout
                    ? fmt::format("no answer within {:.3f}s", seconds(kAttemptTimeout))
                    : e.code().message();
    }
    if (pool->closed) throw closed();
    // An idle connection the member had closed meanwhile says nothing of the member.
    if (failure.empty()) continue;
    log::debug("{}: {} failed at {}: {}", where_, what, member_name(member), failure);
    failures[member] = std::move(failure);
    if (!first_failure) first_failure = Clock::now();
    ++failed_in_a_row;
    current_ = (member + 1) % members_.size();
  }
}

asio::awaitable<Json> Gateway::post(std::string path, Json body, Deadline deadline) {
  http::request<http::string_body> request{http::verb::post, path, 11};
  request.set(http::field::content_type, "application/json");
  request.keep_alive(true);
  request.body() = body.dump();
  request.prepare_payload();
  auto attempt = [&](std::size_t member, Deadline attempt_deadline,
                     std::string& failure) -> asio::awaitable<std::optional<Json>> {
    std::shared_ptr<WatchStream::Connection> connection;
    auto& idle = pool_->idle;
    if (auto it = std::find_if(idle.begin(), idle.end(),
                               [&](const auto& c) { return c->member == member; });
        it != idle.end()) {
      connection = std::move(*it);
      idle.erase(it);
    }
    const bool reused = connection != nullptr;
    http::response<http::string_body> response;
    try {
      if (!connection) connection = co_await open(member, attempt_deadline);
      request.set(http::field::host, member_name(member));
      connection->stream.expires_at(attempt_deadline);
      co_await http::async_write(connection->stream, request, asio::use_awaitable);
      co_await http::async_read(connection->stream, connection->buffer, response,
                                asio::use_awaitable);
      connection->stream.expires_never();
    } catch (const boost::system::system_error& e) {
      if (reused && e.code() != beast::error::timeout) co_return std::nullopt;  // failure empty
      throw;
    }
    Json reply = Json::parse(response.body(), nullptr, /*allow_exceptions=*/false);
    if (reply.is_discarded()) {
      throw Error(Errc::protocol_error,
                  fmt::format("the store at {} answered {} with HTTP {} and no JSON: {}", where_,
                              path, response.result_int(), response.body().substr(0, 200)));
    }
    if (response.result() == http::status::ok) {
      if (response.keep_alive() && !pool_->closed) idle.push_back(std::move(connection));
      co_return reply;
    }
    if (!passing_trouble(reply)) {
      throw Error(Errc::invalid_argument,
                  fmt::format("the store at {} refused {}: {}", where_, path, error_text(reply)));
    }
    failure = error_text(reply);
    co_return std::nullopt;
  };
  co_return co_await with_failover<Json>(path, deadline, attempt);
}

asio::awaitable<std::unique_ptr<WatchStream>> Gateway::watch(Json create_request,
                                                             Deadline deadline) {
  Json body = {{"create_request", std::move(create_request)}};
  http::request<http::string_body> request{http::verb::post, "/v3/watch", 11};
  request.set(http::field::content_type, "application/json");
  request.body() = body.dump();
  request.prepare_payload();
  auto attempt =
      [&](std::size_t member, Deadline attempt_deadline,
          std::string& failure) -> asio::awaitable<std::optional<std::unique_ptr<WatchStream>>> {
    auto connection = co_await open(member, attempt_deadline);
    request.set(http::field::host, member_name(member));
    connection->stream.expires_at(attempt_deadline);
    co_await http::async_write(connection->stream, request, asio::use_awaitable);
    connection->watch.emplace();
    connection->watch->body_limit(boost::none);
    co_await http::async_read_header(connection->stream, connection->buffer, *connection->watch,
                                     asio::use_awaitable);
    if (connection->watch->get().result() != http::status::ok) {
      failure = fmt::format("HTTP {} to a watch", connection->watch->get().result_int());
      co_return std::nullopt;
    }
    auto stream = std::make_unique<WatchStream>(connection);
    std::optional<Json> created = co_await stream->next();
    connection->stream.expires_never();
    if (created && created->value("created", false)) co_return stream;
    failure = created ? fmt::format("the watch was not created: {}", created->dump())
                      : "the watch ended before it was created";
    co_return std::nullopt;
  };
  co_return co_await with_failover<std::unique_ptr<WatchStream>>("a watch", deadline, attempt);
}

}  // namespace braid::transport::etcd
