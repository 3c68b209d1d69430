// What each store request does to the key-value map, the waiters parked on missing keys
// and the connections' wills; store_server.cpp reads the requests and writes the replies.
//
// Cost: a set wakes only the waiters parked on its key (a hash lookup, then one reply per
// waiter); a waiter for n keys sits in n lists until each key appears, its connection
// closes or its timeout passes, whichever comes first. A will costs nothing until its
// connection closes, then one set.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <braid/core/enforce.hpp>

#include "transport/store/store_server_impl.hpp"

namespace braid::transport {
namespace {

// A waiter is dropped after this long even if its client asked for longer; the client's
// own deadline is what callers see, this only bounds what a vanished client leaves behind.
constexpr std::chrono::milliseconds kMaxWait = std::chrono::hours(24 * 7);

// Takes time that depends only on the length of `given`, never on where the first
// mismatch is, so a stranger cannot recover the token byte by byte from reply times.
bool tokens_equal(std::string_view given, std::string_view expected) {
  BRAID_ENFORCE(!expected.empty(), "tokens_equal needs the server's token");
  unsigned difference = given.size() == expected.size() ? 0U : 1U;
  for (std::size_t i = 0; i < given.size(); ++i) {
    difference |= static_cast<unsigned char>(given[i]) ^
                  static_cast<unsigned char>(expected[i % expected.size()]);
  }
  return difference == 0;
}

}  // namespace

void StoreServer::Impl::on_request(const std::shared_ptr<Connection>& c, std::uint64_t id,
                                   proto::HelloRequest r) {
  if (!options_.token.empty() && !tokens_equal(r.token, options_.token)) {
    const std::string why = r.token.empty() ? "this store requires a token and none was given"
                                            : "the token does not match this store's";
    send(c, proto::encode_error(id, Errc::refused, why));
    summary_->count(fmt::format("refused: {}", why));
    drop_after_flush(c, "refused: " + why);
    return;
  }
  authenticate(c);
  send(c, proto::encode_ok(id, {}));
}

void StoreServer::Impl::on_request(const std::shared_ptr<Connection>& c, std::uint64_t id,
                                   proto::SetRequest r) {
  send(c, proto::encode_ok(id, {}));
  store(r.key, std::move(r.value));
}

void StoreServer::Impl::on_request(const std::shared_ptr<Connection>& c, std::uint64_t id,
                                   proto::GetRequest r) {
  if (auto it = data_.find(r.key); it != data_.end()) {
    send(c, proto::encode_ok(id, it->second));
    return;
  }
  std::optional<std::string> value_key = r.key;
  park(c, id, {std::move(r.key)}, std::move(value_key), r.timeout);
}

void StoreServer::Impl::on_request(const std::shared_ptr<Connection>& c, std::uint64_t id,
                                   proto::AddRequest r) {
  const std::optional<std::int64_t> current = counter_at(r.key);
  if (!current) {
    send(c, proto::encode_error(id, Errc::invalid_argument,
                                proto::not_a_counter(r.key, data_.at(r.key).size())));
    return;
  }
  std::int64_t updated = 0;
  if (__builtin_add_overflow(*current, r.delta, &updated)) {
    send(c, proto::encode_error(id, Errc::invalid_argument,
                                proto::counter_overflow(r.key, r.delta, *current)));
    return;
  }
  const std::string text = std::to_string(updated);
  send(c, proto::encode_ok_int64(id, updated));
  store(r.key, Bytes(text.begin(), text.end()));
}

void StoreServer::Impl::on_request(const std::shared_ptr<Connection>& c, std::uint64_t id,
                                   proto::AppendRequest r) {
  const std::string key = r.key;
  const std::optional<std::int64_t> index = append(key, std::move(r.value));
  if (!index) {
    send(c, proto::encode_error(id, Errc::invalid_argument,
                                proto::not_an_entry_count(key, data_.at(key).size())));
    return;
  }
  send(c, proto::encode_ok_int64(id, *index));
}

std::optional<std::int64_t> StoreServer::Impl::counter_at(const std::string& key) const {
  // Counters are stored as decimal text, so a get of a counter reads naturally.
  auto it = data_.find(key);
  if (it == data_.end()) return 0;
  return proto::parse_counter(it->second);
}

std::optional<std::int64_t> StoreServer::Impl::append(const std::string& key, Bytes value) {
  const std::optional<std::int64_t> index = counter_at(key);
  if (!index || *index < 0 || *index == std::numeric_limits<std::int64_t>::max()) {
    return std::nullopt;
  }
  // The entry first, then the count: a reader that sees the count finds every entry below it.
  store(proto::log_entry_key(key, *index), std::move(value));
  const std::string count = std::to_string(*index + 1);
  store(key, Bytes(count.begin(), count.end()));
  return index;
}

void StoreServer::Impl::on_request(const std::shared_ptr<Connection>& c, std::uint64_t id,
                                   proto::CompareSetRequest r) {
  auto it = data_.find(r.key);
  const bool swap = it == data_.end() ? r.expected.empty() : it->second == r.expected;
  if (!swap) {
    send(c, proto::encode_ok(id, it == data_.end() ? Bytes{} : it->second));
    return;
  }
  send(c, proto::encode_ok(id, r.desired));
  store(r.key, std::move(r.desired));
}

void StoreServer::Impl::on_request(const std::shared_ptr<Connection>& c, std::uint64_t id,
                                   proto::EraseRequest r) {
  send(c, proto::encode_ok_bool(id, data_.erase(r.key) > 0));
}

void StoreServer::Impl::on_request(const std::shared_ptr<Connection>& c, std::uint64_t id,
                                   proto::WaitRequest r) {
  std::sort(r.keys.begin(), r.keys.end());
  r.keys.erase(std::unique(r.keys.begin(), r.keys.end()), r.keys.end());
  std::erase_if(r.keys, [&](const std::string& key) { return data_.contains(key); });
  if (r.keys.empty()) {
    send(c, proto::encode_ok(id, {}));
    return;
  }
  park(c, id, std::move(r.keys), std::nullopt, r.timeout);
}

void StoreServer::Impl::on_request(const std::shared_ptr<Connection>& c, std::uint64_t id,
                                   proto::SetWillRequest r) {
  c->will = std::move(r);
  send(c, proto::encode_ok(id, {}));
}

void StoreServer::Impl::on_request(const std::shared_ptr<Connection>& c, std::uint64_t id,
                                   proto::ClearWillRequest /*r*/) {
  c->will.reset();
  send(c, proto::encode_ok(id, {}));
}

void StoreServer::Impl::store(const std::string& key, Bytes value) {
  data_[key] = std::move(value);
  auto node = waiters_by_key_.extract(key);
  if (node.empty()) return;
  for (const std::shared_ptr<Waiter>& waiter : node.mapped()) {
    // Dropped by an earlier waiter's reply overflowing the budget, which closed its
    // connection.
    if (!waiter->connection) continue;
    std::erase(waiter->missing, key);
    if (!waiter->missing.empty()) continue;
    waiter->expiry.cancel();
    auto connection = std::move(waiter->connection);
    std::erase(connection->waiters, waiter);
    send(connection, waiter->value_key
                         ? proto::encode_ok(waiter->request_id, data_.at(*waiter->value_key))
                         : proto::encode_ok(waiter->request_id, {}));
  }
}

void StoreServer::Impl::park(const std::shared_ptr<Connection>& connection, std::uint64_t id,
                             std::vector<std::string> missing, std::optional<std::string> value_key,
                             std::chrono::milliseconds timeout) {
  auto waiter = std::make_shared<Waiter>(connection, id, acceptor_.get_executor());
  waiter->value_key = std::move(value_key);
  waiter->missing = std::move(missing);
  for (const std::string& key : waiter->missing) waiters_by_key_[key].push_back(waiter);
  connection->waiters.push_back(waiter);
  waiter->expiry.expires_after(std::min(timeout, kMaxWait));
  waiter->expiry.async_wait(
      [self = shared_from_this(), weak = std::weak_ptr(waiter)](boost::system::error_code error) {
        auto expired = weak.lock();
        // Answered or dropped meanwhile: its connection was reset.
        if (error || !expired || !expired->connection) return;
        self->expire(expired);
      });
}

// Takes the waiter out of every key list it sits in.
void StoreServer::Impl::unpark(const std::shared_ptr<Waiter>& waiter) {
  for (const std::string& key : waiter->missing) {
    auto it = waiters_by_key_.find(key);
    if (it == waiters_by_key_.end()) continue;
    std::erase(it->second, waiter);
    if (it->second.empty()) waiters_by_key_.erase(it);
  }
  waiter->expiry.cancel();
}

void StoreServer::Impl::expire(const std::shared_ptr<Waiter>& waiter) {
  unpark(waiter);
  auto connection = std::move(waiter->connection);
  std::erase(connection->waiters, waiter);
  send(connection, proto::encode_error(waiter->request_id, Errc::timeout,
                                       fmt::format("{} not set before the request's timeout",
                                                   proto::quote_keys(waiter->missing))));
}

}  // namespace braid::transport
