// The store on an etcd cluster (BRAID_STORE=etcd://...): StoreClient's operations as etcd
// transactions, with the semantics store.hpp promises of braid's own store, so that the
// launchers and the ranks use either without knowing which.
//
//   set          a put
//   get, wait    a range; where the key is absent, a watch from the range's revision on, so
//                a put between the two is never missed
//   add, append, compare_set, erase
//                read the key, then a transaction that applies the change only if the key's
//                mod_revision is still the one read, and otherwise reads it again (so a
//                retry is one round trip): optimistic concurrency, as etcd's own recipes do
//                it, with a short random pause between tries so that writers of one key
//                take turns
//   wills        every client holds a lease (BRAID_ETCD_TTL, kept alive at a third of it)
//                and, under it, a key that says it is alive. A will is a key of its own,
//                not under the lease. When the lease ends -- the client was destroyed and
//                revoked it, or its process died and stopped renewing it -- etcd deletes the
//                alive key; every client of the namespace watches those deletions, and the
//                first to see one carries out the dead client's will in one transaction that
//                also deletes it, so exactly one does. A client that starts looks for wills
//                whose writer is already gone, so a will fires even when nobody was
//                watching as its writer died.
//
// Exactly once. etcd may apply a transaction whose reply is then lost (its member died
// mid-answer); the gateway sends it again elsewhere. Every mutating transaction therefore
// also writes a receipt (a key under the client's lease, gone with it) and applies only
// while the receipt is absent: a transaction sent twice applies once, and the second
// reply reads the first's receipt.
//
// Keys. Every key lies under the address's etcd_namespace; the store's own under
// "<namespace>.braid-store/": alive/<lease>, will/<lease>, receipt/<lease>/<n>.
//
// What it costs against braid's own store: a will fires when the lease ends, up to
// BRAID_ETCD_TTL after a process dies (braid's store notices a closed connection at once;
// braid-run notices its ranks' deaths itself either way); add, append and compare_set take
// two round trips (a read, then the transaction), one more for each race lost; values are
// capped by etcd's request size (1.5 MiB by default), not 64 MiB. In exchange the store
// survives any minority of its members.
#include <algorithm>
#include <array>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <unistd.h>
#include <unordered_set>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/log.hpp>

#include "transport/store/etcd_gateway.hpp"
#include "transport/store/store_client_impl.hpp"
#include "transport/store/store_protocol.hpp"
#include "transport/store/store_time.hpp"

namespace braid::transport {
namespace {

using etcd::base64;
using etcd::int_field;
using etcd::Json;
using namespace std::chrono_literals;
namespace proto = store_protocol;

// connect() retries a cluster that does not answer yet after this pause, up to its deadline.
constexpr Clock::duration kConnectRetryPause = 200ms;
// A destroyed client revokes its lease (so its will fires now, not a TTL later) within this.
constexpr Clock::duration kRevokeTimeout = 2s;
// The longest pause between two tries of an update that lost a race (back_off).
constexpr Clock::duration kMaxConflictPause = 32ms;

std::string text_of(const Bytes& bytes) {
  return std::string(bytes.begin(), bytes.end());
}
Bytes bytes_of(std::string_view text) {
  return Bytes(text.begin(), text.end());
}

// The key range etcd calls a prefix: [prefix, prefix with its last byte + 1).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// A key as a range or a transaction names it: {"key": base64}.
Json key_object(std::string_view key) {
  return Json{{"key", base64(key)}};
}

Json put(std::string_view key, std::string_view value, std::string_view lease = {}) {
  Json request = {{"key", base64(key)}, {"value", base64(value)}};
  if (!lease.empty()) request["lease"] = std::string(lease);
  return Json{{"request_put", std::move(request)}};
}
Json delete_key(std::string_view key) {
  return Json{{"request_delete_range", key_object(key)}};
}
Json range_request(std::string_view key) {
  return Json{{"request_range", key_object(key)}};
}
// The key's mod_revision is `revision` (0: the key is absent).
Json modified_at(std::string_view key, std::int64_t revision) {
  return Json{{"key", base64(key)},
              {"target", "MOD"},
              {"result", "EQUAL"},
              {"mod_revision", std::to_string(revision)}};
}
Json absent(std::string_view key) {
  return Json{
      {"key", base64(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}};
}
Json present(std::string_view key) {
  return Json{
      {"key", base64(key)}, {"target", "CREATE"}, {"result", "GREATER"}, {"create_revision", "0"}};
}

// One key as a range reply holds it.
struct Entry {
  Bytes value;
  std::int64_t mod_revision = 0;  // 0: absent
};

Entry first_entry(const Json& range_reply) {
  auto kvs = range_reply.find("kvs");
  if (kvs == range_reply.end() || !kvs->is_array() || kvs->empty()) return {};
  const Json& kv = kvs->front();
  return {.value = etcd::unbase64(kv.value("value", "")),
          .mod_revision = int_field(kv, "mod_revision")};
}

// A will as its key holds it: u8 append, u32 key length, key, value.
struct Will {
  bool append = false;
  std::string key;
  Bytes value;
};

std::string encode_will(const Will& will) {
  std::string out(1, will.append ? '\1' : '\0');
  const auto length = static_cast<std::uint32_t>(will.key.size());
  for (int shift = 0; shift < 32; shift += 8) out += static_cast<char>((length >> shift) & 0xff);
  out += will.key;
  out.append(will.value.begin(), will.value.end());
  return out;
}

std::optional<Will> decode_will(const Bytes& bytes) {
  if (bytes.size() < 5) return std::nullopt;
  std::uint32_t length = 0;
  for (int i = 0; i < 4; ++i) length |= std::uint32_t{bytes[1 + i]} << (8 * i);
  if (bytes.size() - 5 < length) return std::nullopt;
  Will will{.append = bytes[0] != 0};
  will.key.assign(bytes.begin() + 5, bytes.begin() + 5 + length);
  will.value.assign(bytes.begin() + 5 + length, bytes.end());
  return will;
}

// Operations run on the client's executor with the backend held by StoreClient for their
// life; the two loops start() spawns hold it themselves.
class EtcdStoreConnection final : public StoreBackend {
 public:
  EtcdStoreConnection(asio::any_io_executor executor, std::shared_ptr<etcd::Gateway> gateway,
                      std::string key_namespace)
      : StoreBackend(executor, gateway->where()),
        gateway_(std::move(gateway)),
        namespace_(std::move(key_namespace)),
        own_(namespace_ + ".braid-store/") {}

  static asio::awaitable<std::shared_ptr<StoreBackend>> connect(asio::any_io_executor executor,
                                                                const StoreAddress& address,
                                                                Deadline deadline);

  asio::awaitable<void> set(std::string key, Bytes value) override {
    Json request = {{"key", base64(wire(key))}, {"value", base64(value)}};
    co_await post("/v3/kv/put", std::move(request), "store.set");
  }

  asio::awaitable<Bytes> get(std::string key, Deadline deadline) override {
    const auto started = Clock::now();
    std::optional<Bytes> value = co_await await_key(wire(key), deadline, "store.get");
    if (!value) {
      throw timed_out("store.get", fmt::format("key '{}' was not set", key),
                      Clock::now() - started);
    }
    co_return std::move(*value);
  }

  asio::awaitable<void> wait(std::vector<std::string> keys, Deadline deadline) override {
    const auto started = Clock::now();
    for (const std::string& key : keys) {
      if (co_await await_key(wire(key), deadline, "store.wait")) continue;
      std::string awaited = keys.size() == 1
                                ? fmt::format("key '{}' was not set", keys[0])
                                : fmt::format("keys {} were not all set", proto::quote_keys(keys));
      throw timed_out("store.wait", awaited, Clock::now() - started);
    }
  }

  asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta) override {
    const std::string receipt = next_receipt();
    Entry current = co_await read(key, "store.add");
    for (int conflicts = 0;;) {
      const std::optional<std::int64_t> count = counter_of(current);
      if (!count) {
        throw Error(Errc::invalid_argument, proto::not_a_counter(key, current.value.size()),
                    {.operation = "store.add"});
      }
      std::int64_t updated = 0;
      if (__builtin_add_overflow(*count, delta, &updated)) {
        throw Error(Errc::invalid_argument, proto::counter_overflow(key, delta, *count),
                    {.operation = "store.add"});
      }
      const std::string text = std::to_string(updated);
      Json changes = Json::array({put(wire(key), text)});
      if (std::optional<Bytes> done =
              co_await apply(key, current, receipt, text, std::move(changes), "store.add")) {
        co_return *proto::parse_counter(*done);
      }
      co_await back_off(++conflicts);
    }
  }

  asio::awaitable<std::int64_t> append(std::string key, Bytes value) override {
    const std::string receipt = next_receipt();
    Entry current = co_await read(key, "store.append");
    for (int conflicts = 0;;) {
      const std::optional<std::int64_t> count = counter_of(current);
      if (!count || *count < 0 || *count == std::numeric_limits<std::int64_t>::max()) {
        throw Error(Errc::invalid_argument, proto::not_an_entry_count(key, current.value.size()),
                    {.operation = "store.append"});
      }
      Json changes = Json::array({put(wire(key), std::to_string(*count + 1)),
                                  put(wire(proto::log_entry_key(key, *count)), text_of(value))});
      if (std::optional<Bytes> done = co_await apply(key, current, receipt, std::to_string(*count),
                                                     std::move(changes), "store.append")) {
        co_return *proto::parse_counter(*done);
      }
      co_await back_off(++conflicts);
    }
  }

  asio::awaitable<Bytes> compare_set(std::string key, Bytes expected, Bytes desired) override {
    const std::string receipt = next_receipt();
    Entry current = co_await read(key, "store.compare_set");
    for (int conflicts = 0;;) {
      const bool matches = current.mod_revision == 0 ? expected.empty() : current.value == expected;
      if (!matches) co_return current.value;
      Json changes = Json::array({put(wire(key), text_of(desired))});
      if (co_await apply(key, current, receipt, "", std::move(changes), "store.compare_set")) {
        co_return desired;
      }
      co_await back_off(++conflicts);
    }
  }

  asio::awaitable<bool> erase(std::string key) override {
    const std::string receipt = next_receipt();
    Entry current = co_await read(key, "store.erase");
    for (int conflicts = 0;;) {
      if (current.mod_revision == 0) co_return false;
      Json changes = Json::array({delete_key(wire(key))});
      if (co_await apply(key, current, receipt, "", std::move(changes), "store.erase")) {
        co_return true;
      }
      co_await back_off(++conflicts);
    }
  }

  asio::awaitable<void> set_will(std::string key, Bytes value, bool append) override {
    const std::string will = encode_will({.append = append, .key = wire(key), .value = value});
    // Only while this client is alive: a will written after its lease ended would have
    // nobody to fire it.
    Json request = {{"compare", Json::array({present(alive_key())})},
                    {"success", Json::array({put(will_key(), will)})}};
    const Json reply = co_await post("/v3/kv/txn", std::move(request), "store.set_will");
    if (!reply.value("succeeded", false)) {
      throw Error(
          Errc::peer_failed,
          fmt::format("this client's lease on the store at {} ended before its will was set "
                      "(it went unrenewed for over {:.0f}s)",
                      where_, seconds(ttl_)),
          {.operation = "store.set_will"});
    }
  }

  asio::awaitable<void> clear_will() override {
    co_await post("/v3/kv/deleterange", key_object(will_key()), "store.clear_will");
  }

  void close() override {
    fail(Error(Errc::closed, fmt::format("the client of the store at {} was destroyed", where_)));
  }

 private:
  std::shared_ptr<EtcdStoreConnection> self() {
    return std::static_pointer_cast<EtcdStoreConnection>(shared_from_this());
  }
  std::string wire(std::string_view key) const { return namespace_ + std::string(key); }
  std::string alive_key() const { return own_ + "alive/" + lease_; }
  std::string will_key() const { return own_ + "will/" + lease_; }
  std::string next_receipt() { return fmt::format("{}receipt/{}/{}", own_, lease_, receipts_++); }
  static std::optional<std::int64_t> counter_of(const Entry& entry) {
    return entry.mod_revision == 0 ? std::optional<std::int64_t>(0)
                                   : proto::parse_counter(entry.value);
  }

  // Starts the client: its lease, its alive key, and the loops that renew the lease and
  // carry out the wills of clients that die.
  asio::awaitable<void> start(Deadline deadline);
  asio::awaitable<void> keep_alive();
  asio::awaitable<void> watch_for_deaths();
  // Carries out the will of the client whose lease was `lease`, if it left one.
  asio::awaitable<void> fire_will(std::string lease);

  // The gateway's post, failing as the client has failed (closed, lease lost), with
  // `operation` in the error's context.
  asio::awaitable<Json> post(std::string path, Json body, const char* operation,
                             Deadline deadline = default_deadline());
  asio::awaitable<Entry> read(const std::string& key, const char* operation) {
    const Json reply = co_await post("/v3/kv/range", key_object(wire(key)), operation);
    co_return first_entry(reply);
  }
  // Applies `changes` if `key` is still as `current` says, writing `receipt` = `result`
  // with them, unless the receipt exists. Returns the receipt's value once applied (by this
  // call or by an earlier copy of it); nullopt when the key changed meanwhile, with
  // `current` as it is now (the same transaction reads it: one round trip a retry).
  asio::awaitable<std::optional<Bytes>> apply(const std::string& key, Entry& current,
                                              const std::string& receipt, std::string result,
                                              Json changes, const char* operation);
  // After the n-th conflict of an operation: a random pause of up to 2^n ms (at most
  // kMaxConflictPause), so that many clients updating one key take turns instead of all
  // retrying at once, most of them in vain.
  asio::awaitable<void> back_off(int conflicts);
  // The value of `key` (whole, on the wire) once it exists; nullopt at `deadline`.
  asio::awaitable<std::optional<Bytes>> await_key(std::string key, Deadline deadline,
                                                  const char* operation);
  void throw_if_failed(const char* operation) const {
    if (failure_) throw Error(failure_->code(), failure_->detail(), {.operation = operation});
  }
  void fail(Error error);

  // An open watch, listed where fail() can end it for as long as it is open.
  struct Listed {
    Listed(EtcdStoreConnection& impl, etcd::WatchStream* watch) : impl(impl), watch(watch) {
      impl.watches_.insert(watch);
    }
    ~Listed() { impl.watches_.erase(watch); }
    Listed(const Listed&) = delete;
    Listed& operator=(const Listed&) = delete;
    EtcdStoreConnection& impl;
    etcd::WatchStream* watch;
  };

  std::shared_ptr<etcd::Gateway> gateway_;
  const std::string namespace_;
  const std::string own_;  // the store's own keys: alive, wills, receipts
  std::string lease_;      // this client's lease, as etcd numbers it (decimal)
  Clock::duration ttl_{};
  std::uint64_t receipts_ = 0;
  std::unordered_set<etcd::WatchStream*> watches_;  // open ones, for fail() to end
  std::minstd_rand random_{static_cast<std::uint32_t>(::getpid()) ^
                           static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(this))};
  std::optional<Error> failure_;
};

asio::awaitable<std::shared_ptr<StoreBackend>> EtcdStoreConnection::connect(
    asio::any_io_executor executor, const StoreAddress& address, Deadline deadline) {
  auto gateway = std::make_shared<etcd::Gateway>(executor, address.etcd_members);
  auto impl = std::make_shared<EtcdStoreConnection>(executor, gateway, address.etcd_namespace);
  const auto started = Clock::now();
  for (;;) {
    try {
      co_await impl->start(deadline);
      co_return impl;
    } catch (const Error& e) {
      // etcd may still be starting (ranks start in any order), until the deadline.
      if (e.code() != Errc::peer_failed || Clock::now() >= deadline) {
        gateway->close();
        if (e.code() != Errc::peer_failed) throw;
        throw Error(Errc::timeout,
                    fmt::format("could not reach the store at {} within {:.3f}s: {}",
                                gateway->where(), seconds(Clock::now() - started), e.detail()),
                    {.operation = "store.connect"});
      }
      log::debug("store client: {} not reachable yet ({})", gateway->where(), e.detail());
    }
    asio::steady_timer retry(executor, std::min(Clock::now() + kConnectRetryPause, deadline));
    co_await retry.async_wait(asio::use_awaitable);
  }
}

asio::awaitable<void> EtcdStoreConnection::start(Deadline deadline) {
  const auto ttl = std::chrono::ceil<std::chrono::seconds>(config::seconds_value("BRAID_ETCD_TTL"));
  if (ttl.count() < 1) {
    throw Error(Errc::invalid_environment,
                fmt::format("BRAID_ETCD_TTL={} must be at least 1 second",
                            config::string_value("BRAID_ETCD_TTL")),
                {.operation = "store.connect"});
  }
  // Within the connect deadline: the cluster may not be up yet.
  // Named, not braced in the co_await: GCC 12 cannot keep a braced list's literals in a
  // coroutine frame.
  Json asked = {{"TTL", ttl.count()}};
  const Json grant = co_await gateway_->post("/v3/lease/grant", std::move(asked),
                                             std::min(deadline, default_deadline()));
  lease_ = std::to_string(int_field(grant, "ID"));
  // etcd may raise a TTL below its minimum (about 2 s with default settings).
  ttl_ = std::chrono::seconds(std::max<std::int64_t>(int_field(grant, "TTL"), ttl.count()));
  const std::string self_name = fmt::format("pid {}", ::getpid());
  Json alive = put(alive_key(), self_name, lease_)["request_put"];
  co_await gateway_->post("/v3/kv/put", std::move(alive), std::min(deadline, default_deadline()));
  log::debug("store client: {} holds lease {} ({:.0f}s)", where_, lease_, seconds(ttl_));
  asio::co_spawn(
      executor_, [self = self()] { return self->keep_alive(); }, asio::detached);
  asio::co_spawn(
      executor_, [self = self()] { return self->watch_for_deaths(); }, asio::detached);
}

asio::awaitable<Json> EtcdStoreConnection::post(std::string path, Json body, const char* operation,
                                                Deadline deadline) {
  throw_if_failed(operation);
  Json reply;
  try {
    reply = co_await gateway_->post(std::move(path), std::move(body), deadline);
  } catch (const Error& e) {
    throw_if_failed(operation);  // closed: say why it was
    throw Error(e.code(), e.detail(), {.operation = operation});
  }
  throw_if_failed(operation);
  co_return reply;
}

asio::awaitable<std::optional<Bytes>> EtcdStoreConnection::apply(const std::string& key,
                                                                 Entry& current,
                                                                 const std::string& receipt,
                                                                 std::string result, Json changes,
                                                                 const char* operation) {
  changes.push_back(put(receipt, result, lease_));
  Json request = {
      {"compare", Json::array({modified_at(wire(key), current.mod_revision), absent(receipt)})},
      {"success", std::move(changes)},
      {"failure", Json::array({range_request(receipt), range_request(wire(key))})}};
  const Json reply = co_await post("/v3/kv/txn", std::move(request), operation);
  if (reply.value("succeeded", false)) co_return bytes_of(result);
  const Json responses = reply.value("responses", Json::array());
  if (responses.size() != 2) {
    throw Error(Errc::protocol_error,
                fmt::format("the store at {} answered a transaction with {} results, not 2", where_,
                            responses.size()),
                {.operation = operation});
  }
  // The receipt is there only if an earlier copy of this transaction applied.
  const Entry earlier = first_entry(responses[0].value("response_range", Json::object()));
  if (earlier.mod_revision != 0) co_return earlier.value;
  current = first_entry(responses[1].value("response_range", Json::object()));
  co_return std::nullopt;
}

asio::awaitable<void> EtcdStoreConnection::back_off(int conflicts) {
  const auto longest = std::min<Clock::duration>(
      std::chrono::milliseconds(std::int64_t{1} << std::min(conflicts, 16)), kMaxConflictPause);
  std::uniform_int_distribution<Clock::rep> pick(0, longest.count());
  asio::steady_timer pause(executor_, Clock::now() + Clock::duration(pick(random_)));
  co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
}

asio::awaitable<std::optional<Bytes>> EtcdStoreConnection::await_key(std::string key,
                                                                     Deadline deadline,
                                                                     const char* operation) {
  for (;;) {
    const Json reply = co_await post("/v3/kv/range", key_object(key), operation);
    if (const Entry entry = first_entry(reply); entry.mod_revision != 0) co_return entry.value;
    if (Clock::now() >= deadline) co_return std::nullopt;
    const std::int64_t revision = int_field(reply.value("header", Json::object()), "revision");
    // From the revision the range saw, so that a put in between is seen.
    Json create = {{"key", base64(key)},
                   {"start_revision", std::to_string(revision + 1)},
                   {"filters", Json::array({"NODELETE"})}};
    std::shared_ptr<etcd::WatchStream> watch;
    try {
      watch = co_await gateway_->watch(std::move(create), default_deadline());
    } catch (const Error& e) {
      throw_if_failed(operation);
      throw Error(e.code(), e.detail(), {.operation = operation});
    }
    throw_if_failed(operation);
    const Listed listed(*this, watch.get());
    // The deadline ends the watch; the loop above then answers nullopt.
    asio::steady_timer timeout(executor_, deadline);
    timeout.async_wait([watch](boost::system::error_code error) {
      if (!error) watch->close();
    });
    while (std::optional<Json> result = co_await watch->next()) {
      for (const Json& event : result->value("events", Json::array())) {
        const Json& kv = event.value("kv", Json::object());
        if (event.value("type", "PUT") == "PUT" &&
            etcd::unbase64(kv.value("key", "")) == bytes_of(key)) {
          timeout.cancel();
          co_return etcd::unbase64(kv.value("value", ""));
        }
      }
      // Compacted past the revision asked for, or ended by etcd: read the key again.
      if (result->value("canceled", false)) break;
    }
    timeout.cancel();
    throw_if_failed(operation);
  }
}

asio::awaitable<void> EtcdStoreConnection::keep_alive() {
  auto self = shared_from_this();
  while (!failure_) {
    asio::steady_timer pause(executor_, Clock::now() + ttl_ / 3);
    co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
    if (failure_) co_return;
    try {
      Json renewal = {{"ID", lease_}};
      const Json reply =
          co_await gateway_->post("/v3/lease/keepalive", std::move(renewal), Clock::now() + ttl_);
      if (int_field(reply.value("result", Json::object()), "TTL") <= 0) {
        fail(Error(Errc::peer_failed,
                   fmt::format("this client's lease on the store at {} ended (unrenewed for over "
                               "{:.0f}s): its will has fired",
                               where_, seconds(ttl_))));
      }
    } catch (const Error& e) {
      if (e.code() == Errc::closed) co_return;
      fail(Error(Errc::peer_failed, fmt::format("lost the store at {}: {}", where_, e.detail())));
    }
  }
}

asio::awaitable<void> EtcdStoreConnection::watch_for_deaths() {
  auto self = shared_from_this();
  const std::string alive = own_ + "alive/";
  const std::string wills = own_ + "will/";
  while (!failure_) {
    try {
      // Who is alive now, and every will whose writer is not: fired here. Deaths after
      // that revision come through the watch.
      Json list_alive = {
          {"key", base64(alive)}, {"range_end", base64(prefix_end(alive))}, {"keys_only", true}};
      const Json living =
          co_await gateway_->post("/v3/kv/range", std::move(list_alive), default_deadline());
      const std::int64_t revision = int_field(living.value("header", Json::object()), "revision");
      std::unordered_set<std::string> leases;
      for (const Json& kv : living.value("kvs", Json::array())) {
        leases.insert(text_of(etcd::unbase64(kv.value("key", ""))).substr(alive.size()));
      }
      Json create = {{"key", base64(alive)},
                     {"range_end", base64(prefix_end(alive))},
                     {"start_revision", std::to_string(revision + 1)},
                     {"filters", Json::array({"NOPUT"})}};
      std::shared_ptr<etcd::WatchStream> watch =
          co_await gateway_->watch(std::move(create), default_deadline());
      if (failure_) co_return;
      const Listed listed(*this, watch.get());
      // At the revision the alive keys were read at: a will written since belongs to a
      // client that was alive then, whose death the watch will see.
      Json list_wills = {{"key", base64(wills)},
                         {"range_end", base64(prefix_end(wills))},
                         {"keys_only", true},
                         {"revision", std::to_string(revision)}};
      const Json written =
          co_await gateway_->post("/v3/kv/range", std::move(list_wills), default_deadline());
      for (const Json& kv : written.value("kvs", Json::array())) {
        std::string lease = text_of(etcd::unbase64(kv.value("key", ""))).substr(wills.size());
        if (!leases.contains(lease)) co_await fire_will(std::move(lease));
      }
      while (std::optional<Json> result = co_await watch->next()) {
        for (const Json& event : result->value("events", Json::array())) {
          std::string key =
              text_of(etcd::unbase64(event.value("kv", Json::object()).value("key", "")));
          if (key.starts_with(alive)) co_await fire_will(key.substr(alive.size()));
        }
        if (result->value("canceled", false)) break;
      }
    } catch (const Error& e) {
      if (failure_ || e.code() == Errc::closed) co_return;
      fail(Error(Errc::peer_failed, fmt::format("lost the store at {}: {}", where_, e.detail())));
      co_return;
    }
  }
}

asio::awaitable<void> EtcdStoreConnection::fire_will(std::string lease) {
  const std::string will_at = own_ + "will/" + lease;
  const std::string alive_at = own_ + "alive/" + lease;
  for (;;) {
    // Only a dead client's will fires: every transaction below also asks that its alive key
    // be gone, and one that is there ends the attempt.
    const Json living =
        co_await gateway_->post("/v3/kv/range", key_object(alive_at), default_deadline());
    if (first_entry(living).mod_revision != 0) co_return;
    const Json reply =
        co_await gateway_->post("/v3/kv/range", key_object(will_at), default_deadline());
    const Entry record = first_entry(reply);
    if (record.mod_revision == 0) co_return;  // none, or another client fired it
    const std::optional<Will> will = decode_will(record.value);
    Json compare = Json::array({modified_at(will_at, record.mod_revision), absent(alive_at)});
    Json success = Json::array({delete_key(will_at)});
    if (will && !will->append) {
      // The first will to fire under a key wins: it sets only an absent key.
      Json first = {
          {"compare", Json::array({modified_at(will_at, record.mod_revision), absent(alive_at),
                                   absent(will->key)})},
          {"success", Json::array({put(will->key, text_of(will->value)), delete_key(will_at)})}};
      const Json set = co_await gateway_->post("/v3/kv/txn", std::move(first), default_deadline());
      if (set.value("succeeded", false)) co_return;
    } else if (will) {
      const Json count_reply =
          co_await gateway_->post("/v3/kv/range", key_object(will->key), default_deadline());
      const Entry count = first_entry(count_reply);
      const std::optional<std::int64_t> entries = counter_of(count);
      if (entries) {
        compare.push_back(modified_at(will->key, count.mod_revision));
        success.push_back(put(will->key, std::to_string(*entries + 1)));
        success.push_back(put(proto::log_entry_key(will->key, *entries), text_of(will->value)));
      }
    }
    // Unreadable, or a log that holds no count, or a key already set: the will is dropped.
    Json txn = {{"compare", std::move(compare)}, {"success", std::move(success)}};
    const Json done = co_await gateway_->post("/v3/kv/txn", std::move(txn), default_deadline());
    if (done.value("succeeded", false)) co_return;
  }
}

void EtcdStoreConnection::fail(Error error) {
  if (failure_) return;
  log::debug("store client: {}", error.detail());
  const bool leaving = error.code() == Errc::closed;
  failure_ = std::move(error);
  for (etcd::WatchStream* watch : watches_) watch->close();
  if (!leaving) {
    gateway_->close();
    return;
  }
  // Revoking the lease ends it now: the alive key goes, and a will still set fires at
  // once rather than a TTL later. Then the connections close.
  auto revoke = [](std::shared_ptr<etcd::Gateway> gateway,
                   std::string lease) -> asio::awaitable<void> {
    try {
      Json revocation = {{"ID", lease}};
      co_await gateway->post("/v3/lease/revoke", std::move(revocation),
                             Clock::now() + kRevokeTimeout);
    } catch (const Error& e) {
      log::debug("store client: could not revoke lease {}: {}", lease, e.detail());
    }
    gateway->close();
  };
  asio::co_spawn(executor_, revoke(gateway_, lease_), asio::detached);
}

}  // namespace

asio::awaitable<std::shared_ptr<StoreBackend>> connect_etcd_store(asio::any_io_executor executor,
                                                                  const StoreAddress& address,
                                                                  Deadline deadline) {
  return EtcdStoreConnection::connect(std::move(executor), address, deadline);
}

}  // namespace braid::transport
