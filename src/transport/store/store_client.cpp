// The store's client side: the public StoreClient, which names keys under the address's
// prefix, hops onto its implementation's executor and traces each operation, and braid's own
// store as one implementation (etcd_store.cpp is the other). One connection carries any
// number of outstanding requests: each gets a request id, one reader coroutine hands
// replies to their waiting callers by id, and one writer drains a queue of frames. A get
// parked on a missing key therefore never holds up a set issued from another coroutine on
// the same client.
//
// All state lives on the executor given to connect(); every public awaitable hops there
// and resumes its caller on the caller's own executor (run_on below: one post each way,
// negligible next to a network round trip).
#include <algorithm>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <unordered_map>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <braid/core/log.hpp>
#include <braid/trace/span.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/store/store.hpp>

#include "transport/store/store_client_impl.hpp"
#include "transport/store/store_frame_io.hpp"
#include "transport/store/store_keepalive.hpp"
#include "transport/store/store_protocol.hpp"
#include "transport/store/store_time.hpp"

namespace braid::transport {
namespace {

namespace proto = store_protocol;
using asio::ip::tcp;
using namespace std::chrono_literals;

// connect() retries a refused or failed attempt after this pause, doubling up to the cap:
// ranks start in any order, and the store usually appears within milliseconds.
constexpr Clock::duration kFirstRetryPause = 10ms;
constexpr Clock::duration kMaxRetryPause = 250ms;

std::chrono::milliseconds remaining(Deadline deadline) {
  return std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()), 0ms);
}

template <class T>
struct CompletionOf {
  using type = void(std::exception_ptr, T);
};
template <>
struct CompletionOf<void> {
  using type = void(std::exception_ptr);
};

// Runs `op` on `executor` and resumes the awaiting coroutine on its own executor. Unlike
// co_spawn(executor, op, use_awaitable), which releases its hold on the awaiting context
// after handing the result over, here that hold travels inside the posted completion and
// is released on the awaiting thread: the client's thread never touches the awaiting
// context again once the result is posted, so that context (another Runtime, say) may be
// destroyed as soon as its coroutine finishes.
template <class T>
asio::awaitable<T> run_on(asio::any_io_executor executor, asio::awaitable<T> op) {
  using Signature = typename CompletionOf<T>::type;
  auto initiate = [](auto handler, asio::any_io_executor executor, asio::awaitable<T> op) {
    asio::any_io_executor caller = asio::prefer(asio::get_associated_executor(handler),
                                                asio::execution::outstanding_work.untracked);
    auto hold = asio::make_work_guard(caller);
    asio::co_spawn(std::move(executor), std::move(op),
                   [handler = std::move(handler), caller, hold = std::move(hold)](
                       std::exception_ptr error, auto... value) mutable {
                     asio::post(caller, [handler = std::move(handler), hold = std::move(hold),
                                         error, ... value = std::move(value)]() mutable {
                       std::move(handler)(error, std::move(value)...);
                     });
                   });
  };
  return asio::async_initiate<const asio::use_awaitable_t<>&, Signature>(
      std::move(initiate), asio::use_awaitable, std::move(executor), std::move(op));
}

// A request waiting for its reply. `wakeup` expires at the request's deadline; the reader
// cancels it early when the reply arrives or the connection fails.
struct Pending {
  Pending(const asio::any_io_executor& executor, Deadline deadline) : wakeup(executor, deadline) {}

  asio::steady_timer wakeup;
  std::optional<proto::Frame> ok;
  std::optional<proto::ErrorReply> error;
};

// braid's own store: one TCP connection to a StoreServer.
class BraidStoreConnection final : public StoreBackend {
 public:
  BraidStoreConnection(asio::any_io_executor executor, const StoreAddress& address)
      : StoreBackend(executor, format_host_port(address.host, address.port)), socket_(executor) {}

  static asio::awaitable<std::shared_ptr<StoreBackend>> connect(asio::any_io_executor executor,
                                                                const StoreAddress& address,
                                                                Deadline deadline);

  // Requests are named locals: GCC 12 destroys a temporary handed to a coroutine by value
  // twice.
  asio::awaitable<void> set(std::string key, Bytes value) override {
    std::string awaited = fmt::format("no reply to set of key '{}'", key);
    proto::Request set = proto::SetRequest{std::move(key), std::move(value)};
    proto::expect_empty(
        co_await request(std::move(set), default_deadline(), "store.set", std::move(awaited)));
  }
  asio::awaitable<Bytes> get(std::string key, Deadline deadline) override {
    std::string awaited = fmt::format("key '{}' was not set", key);
    proto::Request get = proto::GetRequest{std::move(key), remaining(deadline)};
    proto::Frame reply =
        co_await request(std::move(get), deadline, "store.get", std::move(awaited));
    co_return std::move(reply.payload);
  }
  asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta) override {
    std::string awaited = fmt::format("no reply to add to key '{}'", key);
    proto::Request add = proto::AddRequest{std::move(key), delta};
    co_return proto::decode_int64(
        co_await request(std::move(add), default_deadline(), "store.add", std::move(awaited)));
  }
  asio::awaitable<Bytes> compare_set(std::string key, Bytes expected, Bytes desired) override {
    std::string awaited = fmt::format("no reply to compare_set of key '{}'", key);
    proto::Request swap =
        proto::CompareSetRequest{std::move(key), std::move(expected), std::move(desired)};
    proto::Frame reply = co_await request(std::move(swap), default_deadline(), "store.compare_set",
                                          std::move(awaited));
    co_return std::move(reply.payload);
  }
  asio::awaitable<std::int64_t> append(std::string key, Bytes value) override {
    std::string awaited = fmt::format("no reply to append to key '{}'", key);
    proto::Request append = proto::AppendRequest{std::move(key), std::move(value)};
    co_return proto::decode_int64(co_await request(std::move(append), default_deadline(),
                                                   "store.append", std::move(awaited)));
  }
  asio::awaitable<bool> erase(std::string key) override {
    std::string awaited = fmt::format("no reply to erase of key '{}'", key);
    proto::Request erase = proto::EraseRequest{std::move(key)};
    co_return proto::decode_bool(
        co_await request(std::move(erase), default_deadline(), "store.erase", std::move(awaited)));
  }
  asio::awaitable<void> wait(std::vector<std::string> keys, Deadline deadline) override {
    std::string awaited = keys.size() == 1
                              ? fmt::format("key '{}' was not set", keys[0])
                              : fmt::format("keys {} were not all set", proto::quote_keys(keys));
    proto::Request wait = proto::WaitRequest{std::move(keys), remaining(deadline)};
    proto::expect_empty(
        co_await request(std::move(wait), deadline, "store.wait", std::move(awaited)));
  }
  asio::awaitable<void> set_will(std::string key, Bytes value, bool append) override {
    std::string awaited = fmt::format("no reply to set_will of key '{}'", key);
    proto::Request will =
        proto::SetWillRequest{.key = std::move(key), .value = std::move(value), .append = append};
    proto::expect_empty(co_await request(std::move(will), default_deadline(), "store.set_will",
                                         std::move(awaited)));
  }
  asio::awaitable<void> clear_will() override {
    std::string awaited = "no reply to clear_will";
    proto::Request clear = proto::ClearWillRequest{};
    proto::expect_empty(co_await request(std::move(clear), default_deadline(), "store.clear_will",
                                         std::move(awaited)));
  }
  void close() override {
    fail(Error(Errc::closed, fmt::format("the client of the store at {} was destroyed", where_)));
  }

 private:
  void start();

  // Sends `request` and waits until `deadline` for its ok reply. Throws Error with
  // `operation`: the server's error reply, the connection's failure, or Errc::timeout,
  // whose message is `awaited` followed by how long it waited.
  asio::awaitable<proto::Frame> request(proto::Request request, Deadline deadline,
                                        const char* operation, std::string awaited);

  asio::awaitable<void> read_replies();
  void deliver(proto::Frame frame);
  void send(Bytes frame);
  asio::awaitable<void> flush();
  // Fails every pending and future request with `error` and closes the socket; the first
  // failure wins.
  void fail(Error error);

  std::shared_ptr<BraidStoreConnection> self() {
    return std::static_pointer_cast<BraidStoreConnection>(shared_from_this());
  }

  tcp::socket socket_;
  bool started_ = false;
  std::uint64_t next_request_id_ = 1;
  std::unordered_map<std::uint64_t, Pending*> pending_;
  std::deque<Bytes> outbox_;
  bool writing_ = false;
  std::optional<Error> failure_;
};

asio::awaitable<std::shared_ptr<StoreBackend>> BraidStoreConnection::connect(
    asio::any_io_executor executor, const StoreAddress& address, Deadline deadline) {
  const auto started = Clock::now();
  const std::string where = format_host_port(address.host, address.port);
  // The server reads no more than this from a connection before its hello is accepted.
  if (address.token.size() > proto::kMaxTokenBytes) {
    throw Error(Errc::invalid_argument,
                fmt::format("the token is {} bytes; a store accepts tokens of at most {}",
                            address.token.size(), proto::kMaxTokenBytes),
                {.operation = "store.connect"});
  }
  Clock::duration pause = kFirstRetryPause;
  std::string last_failure;
  tcp::resolver resolver(executor);
  for (;;) {
    auto impl = std::make_shared<BraidStoreConnection>(executor, address);
    auto [resolve_error, endpoints] = co_await resolver.async_resolve(
        address.host, std::to_string(address.port), asio::as_tuple(asio::use_awaitable));
    if (resolve_error) {
      last_failure = resolve_error.message();
    } else {
      // A SYN to a host that drops packets would wait out the kernel's ~2 minute timeout;
      // closing the socket at the deadline bounds the attempt.
      asio::steady_timer watchdog(executor, deadline);
      watchdog.async_wait([impl](boost::system::error_code error) {
        boost::system::error_code ignored;
        if (!error && !impl->started_) impl->socket_.close(ignored);
      });
      auto [connect_error, endpoint] = co_await asio::async_connect(
          impl->socket_, endpoints, asio::as_tuple(asio::use_awaitable));
      if (!connect_error) {
        impl->start();
        try {
          proto::Request hello = proto::HelloRequest{address.token};
          std::string awaited = "no answer to hello";
          co_await impl->request(std::move(hello), deadline, "store.connect", std::move(awaited));
          co_return impl;
        } catch (const Error& e) {
          impl->fail(Error(Errc::closed, "connect gave up on this connection"));
          if (e.code() == Errc::refused) {
            throw Error(Errc::refused, fmt::format("wrong or missing token: {}", e.detail()),
                        e.context());
          }
          // The server went away between accept and hello (a restart, say): try again.
          if (e.code() != Errc::peer_failed) throw;
          last_failure = e.detail();
        }
      } else {
        last_failure = connect_error.message();
      }
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      throw Error(Errc::timeout,
                  fmt::format("could not connect to the store at {} within {:.3f}s: {}", where,
                              seconds(now - started), last_failure),
                  {.operation = "store.connect"});
    }
    log::debug("store client: {} not reachable yet ({}), retrying in {:.3f}s", where, last_failure,
               seconds(pause));
    // The last attempt happens at the deadline itself.
    asio::steady_timer retry(executor, std::min(now + pause, deadline));
    co_await retry.async_wait(asio::use_awaitable);
    pause = std::min(pause * 2, kMaxRetryPause);
  }
}

void BraidStoreConnection::start() {
  started_ = true;
  boost::system::error_code ignored;
  socket_.set_option(tcp::no_delay(true), ignored);
  detail::give_up_on_silence(socket_);
  log::debug("store client: connected to {}", where_);
  asio::co_spawn(
      executor_, [self = self()] { return self->read_replies(); }, asio::detached);
}

asio::awaitable<proto::Frame> BraidStoreConnection::request(proto::Request request,
                                                            Deadline deadline,
                                                            const char* operation,
                                                            std::string awaited) {
  auto self = this->self();  // the client may be destroyed while this waits
  if (failure_) throw Error(failure_->code(), failure_->detail(), {.operation = operation});
  const std::uint64_t id = next_request_id_++;
  Bytes frame;
  try {
    frame = proto::encode_request(id, request);
  } catch (const Error& e) {
    throw Error(e.code(), e.detail(), {.operation = operation});
  }

  Pending pending(executor_, deadline);
  pending_.emplace(id, &pending);
  struct Unlist {
    BraidStoreConnection& impl;
    std::uint64_t id;
    ~Unlist() { impl.pending_.erase(id); }
  } unlist{*this, id};

  const auto started = Clock::now();
  send(std::move(frame));
  boost::system::error_code woken_early;
  co_await pending.wakeup.async_wait(asio::redirect_error(asio::use_awaitable, woken_early));

  if (pending.ok) co_return std::move(*pending.ok);
  if (pending.error) {
    if (pending.error->code == Errc::timeout) {
      throw timed_out(operation, awaited, Clock::now() - started);
    }
    throw Error(pending.error->code,
                fmt::format("the store at {} answered: {}", where_, pending.error->message),
                {.operation = operation});
  }
  if (failure_) throw Error(failure_->code(), failure_->detail(), {.operation = operation});
  throw timed_out(operation, awaited, Clock::now() - started);
}

asio::awaitable<void> BraidStoreConnection::read_replies() {
  auto self = this->self();
  std::optional<Error> failure;
  try {
    while (!failure_) {
      std::optional<proto::Frame> frame = co_await proto::read_frame(socket_);
      if (!frame) {
        failure.emplace(Errc::peer_failed,
                        fmt::format("the store at {} closed the connection", where_));
        break;
      }
      deliver(std::move(*frame));
    }
  } catch (const Error& e) {
    failure.emplace(Errc::protocol_error,
                    fmt::format("the store at {} sent a malformed frame: {}", where_, e.detail()));
  } catch (const boost::system::system_error& e) {
    failure.emplace(Errc::peer_failed, fmt::format("lost the connection to the store at {}: {}",
                                                   where_, e.code().message()));
  }
  if (failure) fail(std::move(*failure));
}

void BraidStoreConnection::deliver(proto::Frame frame) {
  std::optional<proto::ErrorReply> error;
  if (frame.opcode == proto::Opcode::error) {
    error = proto::decode_error(frame);
  } else if (frame.opcode != proto::Opcode::ok) {
    throw Error(Errc::protocol_error,
                fmt::format("opcode {:#04x} is not a reply", static_cast<unsigned>(frame.opcode)));
  }
  auto it = pending_.find(frame.request_id);
  // Not pending: its caller's deadline passed before the reply came.
  if (it == pending_.end()) return;
  Pending& pending = *it->second;
  if (error) {
    pending.error = std::move(error);
  } else {
    pending.ok = std::move(frame);
  }
  pending.wakeup.cancel();
  pending_.erase(it);
}

void BraidStoreConnection::send(Bytes frame) {
  outbox_.push_back(std::move(frame));
  if (writing_) return;
  writing_ = true;
  asio::co_spawn(
      executor_, [self = self()] { return self->flush(); }, asio::detached);
}

asio::awaitable<void> BraidStoreConnection::flush() {
  std::string failure;
  try {
    co_await proto::write_frames(socket_, outbox_);
  } catch (const boost::system::system_error& e) {
    failure = e.code().message();
  }
  writing_ = false;
  if (!failure.empty()) {
    outbox_.clear();
    fail(Error(Errc::peer_failed,
               fmt::format("lost the connection to the store at {}: {}", where_, failure)));
  }
}

void BraidStoreConnection::fail(Error error) {
  if (failure_) return;
  log::debug("store client: {}", error.detail());
  failure_ = std::move(error);
  boost::system::error_code ignored;
  socket_.close(ignored);
  for (auto& [id, pending] : pending_) pending->wakeup.cancel();
}

// Runs `operation` on the implementation's executor, traced, holding the implementation
// for the operation's life: the client may be destroyed while it is outstanding.
template <class T>
asio::awaitable<T> traced([[maybe_unused]] std::shared_ptr<StoreBackend> held, const char* name,
                          asio::awaitable<T> operation) {
  // Store requests happen at start-up and in rare coordination steps, so interning the
  // operation's name (a lock and a lookup) is paid only when tracing is on.
  const bool tracing = trace::enabled();
  trace::AsyncSpan span(trace::Category::store,
                        tracing ? trace::intern(name) : trace::Name("store"),
                        tracing ? trace::track("store") : trace::Track{});
  if constexpr (std::is_void_v<T>) {
    co_await std::move(operation);
  } else {
    T result = co_await std::move(operation);
    if constexpr (std::is_same_v<T, Bytes>) span.set_bytes(result.size());
    co_return result;
  }
}

}  // namespace

Error StoreBackend::timed_out(const char* operation, const std::string& awaited,
                              Clock::duration waited) const {
  return Error(Errc::timeout,
               fmt::format("{} within {:.3f}s (store at {})", awaited, seconds(waited), where_),
               {.operation = operation});
}

asio::awaitable<std::shared_ptr<StoreBackend>> connect_braid_store(asio::any_io_executor executor,
                                                                   const StoreAddress& address,
                                                                   Deadline deadline) {
  return BraidStoreConnection::connect(std::move(executor), address, deadline);
}

// The public face's hold on its backend.
struct StoreClient::Impl {
  std::shared_ptr<StoreBackend> backend;
};

StoreClient::StoreClient(std::shared_ptr<Impl> impl, std::string key_prefix)
    : impl_(std::move(impl)), key_prefix_(std::move(key_prefix)) {}

StoreClient::~StoreClient() {
  asio::dispatch(impl_->backend->executor(), [backend = impl_->backend] { backend->close(); });
}

asio::awaitable<std::unique_ptr<StoreClient>> StoreClient::connect(asio::any_io_executor executor,
                                                                   StoreAddress address,
                                                                   Deadline deadline) {
  auto connecting = [](asio::any_io_executor executor, StoreAddress address,
                       Deadline deadline) -> asio::awaitable<std::unique_ptr<StoreClient>> {
    auto impl = std::make_shared<Impl>();
    // An if, not ?: around the two co_awaits, which GCC 12 miscompiles.
    if (address.etcd_members.empty()) {
      impl->backend = co_await connect_braid_store(executor, address, deadline);
    } else {
      impl->backend = co_await connect_etcd_store(executor, address, deadline);
    }
    co_return std::unique_ptr<StoreClient>(new StoreClient(std::move(impl), address.key_prefix));
  };
  return run_on(executor, connecting(executor, std::move(address), deadline));
}

// Each operation names its keys here, on the caller's thread, and runs on the client's
// executor; the caller resumes on its own.

asio::awaitable<void> StoreClient::set(std::string key, Bytes value) {
  return run_on(impl_->backend->executor(),
                traced(impl_->backend, "store.set",
                       impl_->backend->set(key_prefix_ + key, std::move(value))));
}

asio::awaitable<Bytes> StoreClient::get(std::string key, Deadline deadline) {
  return run_on(
      impl_->backend->executor(),
      traced(impl_->backend, "store.get", impl_->backend->get(key_prefix_ + key, deadline)));
}

asio::awaitable<std::int64_t> StoreClient::add(std::string key, std::int64_t delta) {
  return run_on(impl_->backend->executor(),
                traced(impl_->backend, "store.add", impl_->backend->add(key_prefix_ + key, delta)));
}

asio::awaitable<Bytes> StoreClient::compare_set(std::string key, Bytes expected, Bytes desired) {
  return run_on(impl_->backend->executor(),
                traced(impl_->backend, "store.compare_set",
                       impl_->backend->compare_set(key_prefix_ + key, std::move(expected),
                                                   std::move(desired))));
}

asio::awaitable<bool> StoreClient::erase(std::string key) {
  return run_on(impl_->backend->executor(),
                traced(impl_->backend, "store.erase", impl_->backend->erase(key_prefix_ + key)));
}

asio::awaitable<void> StoreClient::wait(std::vector<std::string> keys, Deadline deadline) {
  for (std::string& key : keys) key = key_prefix_ + key;
  return run_on(
      impl_->backend->executor(),
      traced(impl_->backend, "store.wait", impl_->backend->wait(std::move(keys), deadline)));
}

asio::awaitable<void> StoreClient::set_will(std::string key, Bytes value) {
  return run_on(
      impl_->backend->executor(),
      traced(impl_->backend, "store.set_will",
             impl_->backend->set_will(key_prefix_ + key, std::move(value), /*append=*/false)));
}

asio::awaitable<void> StoreClient::set_appending_will(std::string key, Bytes value) {
  return run_on(
      impl_->backend->executor(),
      traced(impl_->backend, "store.set_will",
             impl_->backend->set_will(key_prefix_ + key, std::move(value), /*append=*/true)));
}

asio::awaitable<std::int64_t> StoreClient::append(std::string key, Bytes value) {
  return run_on(impl_->backend->executor(),
                traced(impl_->backend, "store.append",
                       impl_->backend->append(key_prefix_ + key, std::move(value))));
}

asio::awaitable<void> StoreClient::clear_will() {
  return run_on(impl_->backend->executor(),
                traced(impl_->backend, "store.clear_will", impl_->backend->clear_will()));
}

}  // namespace braid::transport
