#include <optional>
#include <string>
#include <sys/socket.h>
#include <sys/time.h>
#include <thread>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/write.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/core/runtime.hpp>
#include <braid/trace/recorder.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/store/store.hpp>

#include "etcd_test_cluster.hpp"
#include "store_test_helpers.hpp"
#include "transport/store/store_protocol.hpp"

namespace braid::transport {
namespace {

using namespace std::chrono_literals;
using asio::ip::tcp;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
namespace proto = store_protocol;

// Asserts that `work` throws braid::Error with `code` and returns it for more checks.
template <class T>
Error error_from(Runtime& runtime, asio::awaitable<T> work, Errc code) {
  try {
    run_on(runtime, std::move(work));
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e;
  }
  ADD_FAILURE() << "no braid::Error thrown";
  return Error(Errc::invalid_argument, "no error");
}

// A socket that speaks raw bytes to the server, as a confused or hostile peer would.
class RawPeer {
 public:
  explicit RawPeer(std::uint16_t port) : socket_(io_) {
    socket_.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    // Blocking reads give up after 5 s so a server that never closes fails the test
    // instead of hanging it.
    timeval timeout{.tv_sec = 5, .tv_usec = 0};
    setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  }

  void write(const Bytes& data) { asio::write(socket_, asio::buffer(data)); }

  // The next frame the server sends.
  proto::Frame read_frame() {
    std::array<std::uint8_t, proto::kLengthBytes> prefix{};
    asio::read(socket_, asio::buffer(prefix));
    std::array<std::uint8_t, proto::kHeaderBytes> header{};
    asio::read(socket_, asio::buffer(header));
    proto::Frame frame = proto::decode_header(header);
    frame.payload.resize(proto::decode_length(prefix) - proto::kHeaderBytes);
    asio::read(socket_, asio::buffer(frame.payload));
    return frame;
  }
  void stop_writing() { socket_.shutdown(tcp::socket::shutdown_send); }

  // Everything the server sends until it closes; fails the test if it does not close.
  Bytes read_until_closed() {
    Bytes received;
    std::array<std::uint8_t, 4096> chunk{};
    boost::system::error_code error;
    for (;;) {
      const std::size_t n = socket_.read_some(asio::buffer(chunk), error);
      received.insert(received.end(), chunk.begin(), chunk.begin() + n);
      if (error) break;
    }
    EXPECT_TRUE(error == asio::error::eof || error == asio::error::connection_reset)
        << "the server did not close the connection: " << error.message();
    return received;
  }

 private:
  asio::io_context io_;
  tcp::socket socket_;
};

// Splits a byte stream into frames.
std::vector<proto::Frame> frames_in(const Bytes& stream) {
  std::vector<proto::Frame> out;
  std::size_t at = 0;
  while (stream.size() - at >= proto::kLengthBytes + proto::kHeaderBytes) {
    const std::size_t length =
        proto::decode_length(std::span<const std::uint8_t, proto::kLengthBytes>(
            stream.data() + at, proto::kLengthBytes));
    at += proto::kLengthBytes;
    proto::Frame frame = proto::decode_header(std::span<const std::uint8_t, proto::kHeaderBytes>(
        stream.data() + at, proto::kHeaderBytes));
    frame.payload.assign(stream.begin() + at + proto::kHeaderBytes, stream.begin() + at + length);
    at += length;
    out.push_back(std::move(frame));
  }
  EXPECT_EQ(at, stream.size()) << "a partial frame trails the stream";
  return out;
}

class Store : public ::testing::Test {
 protected:
  explicit Store(std::string token = "")
      : server_(std::in_place, runtime_,
                StoreServer::Options{.host = "127.0.0.1", .token = token}) {}

  StoreAddress address(std::string token = "") const {
    return {"127.0.0.1", server_->port(), std::move(token)};
  }
  std::unique_ptr<StoreClient> connect(std::string token = "") {
    return run_on(runtime_, StoreClient::connect(runtime_.executor(), address(std::move(token)),
                                                 deadline_after(5s)));
  }

  // Declared first so it outlives the server and every client a test creates.
  Runtime runtime_;
  std::optional<StoreServer> server_;
};

class TokenStore : public Store {
 protected:
  TokenStore() : Store("s3cret") {}
};

// What every store promises (store.hpp), held to by braid's own and by an etcd cluster
// alike: each test runs on both. One etcd serves the whole suite, each test's keys under a
// namespace of its own.
enum class Backend { braid, etcd };

class AnyStore : public ::testing::TestWithParam<Backend> {
 protected:
  static void SetUpTestSuite() { etcd_ = new EtcdTestCluster(1); }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }

  AnyStore() {
    if (GetParam() == Backend::braid)
      server_.emplace(runtime_, StoreServer::Options{.host = "127.0.0.1"});
  }

  StoreAddress address() const {
    if (GetParam() == Backend::braid) return {"127.0.0.1", server_->port(), ""};
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    return etcd_->address(fmt::format("{}-{}/", test->name(), ::getpid()));
  }
  std::unique_ptr<StoreClient> connect(std::string key_prefix = "") {
    StoreAddress at = address();
    at.key_prefix = std::move(key_prefix);
    return run_on(runtime_,
                  StoreClient::connect(runtime_.executor(), std::move(at), deadline_after(10s)));
  }

  static inline EtcdTestCluster* etcd_ = nullptr;
  // Declared first so it outlives the server and every client a test creates.
  Runtime runtime_;
  std::optional<StoreServer> server_;
};

INSTANTIATE_TEST_SUITE_P(BraidAndEtcd, AnyStore, ::testing::Values(Backend::braid, Backend::etcd),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param == Backend::braid ? "braid" : "etcd";
                         });

TEST_P(AnyStore, SetThenGetReturnsTheValue) {
  auto store = connect();
  run_on(runtime_, store->set("greeting", bytes("hello")));
  EXPECT_EQ(run_on(runtime_, store->get("greeting", deadline_after(1s))), bytes("hello"));

  run_on(runtime_, store->set("greeting", bytes("again")));
  run_on(runtime_, store->set("empty", {}));
  EXPECT_EQ(run_on(runtime_, store->get("greeting", deadline_after(1s))), bytes("again"));
  EXPECT_EQ(run_on(runtime_, store->get("empty", deadline_after(1s))), Bytes{});
}

TEST_P(AnyStore, OperationsAreTracedOnTheStoreTrackWhenTracingIsOn) {
  auto store = connect();
  trace::clear();
  trace::set_enabled(true);
  run_on(runtime_, store->set("traced", bytes("value")));
  run_on(runtime_, store->get("traced", deadline_after(1s)));
  trace::set_enabled(false);
  run_on(runtime_, store->get("traced", deadline_after(1s)));  // off: not recorded

  const auto snapshot = trace::snapshot();
  const std::uint32_t store_track = trace::track("store").id;
  std::vector<std::string> names;
  for (const auto& record : snapshot.records) {
    if (record.category != trace::Category::store) continue;
    EXPECT_EQ(record.track, store_track);
    EXPECT_LE(record.begin_ns, record.end_ns);
    names.emplace_back(record.name);
    if (names.back() == "store.get") {
      EXPECT_EQ(record.bytes, 5u);
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"store.set", "store.get"}));
  trace::clear();
}

TEST_P(AnyStore, GetWaitsForAKeySetLater) {
  auto reader = connect();
  auto writer = connect();
  Future<Bytes> value = runtime_.spawn(reader->get("late", deadline_after(5s)));
  EXPECT_FALSE(value.wait_for(30ms));
  run_on(runtime_, writer->set("late", bytes("here")));
  EXPECT_EQ(value.get(), bytes("here"));
}

TEST_P(AnyStore, GetTimesOutWithAnErrorNamingTheKeyAndTheWait) {
  auto store = connect();
  const auto started = Clock::now();
  Error e = error_from(runtime_, store->get("never/set", deadline_after(100ms)), Errc::timeout);
  EXPECT_GE(Clock::now() - started, 100ms);
  EXPECT_EQ(e.context().operation, "store.get");
  EXPECT_THAT(e.what(), HasSubstr("'never/set'"));
  EXPECT_THAT(e.what(), ContainsRegex("was not set within 0\\.[0-9]+s"));

  // The client stays usable, and a value set afterwards is not swallowed by the old wait.
  run_on(runtime_, store->set("never/set", bytes("now")));
  EXPECT_EQ(run_on(runtime_, store->get("never/set", deadline_after(1s))), bytes("now"));
}

TEST_P(AnyStore, OneClientServesASetWhileItsGetIsStillWaiting) {
  auto store = connect();
  Future<Bytes> waiting = runtime_.spawn(store->get("pending", deadline_after(5s)));
  run_on(runtime_, store->set("other", bytes("x")));
  EXPECT_FALSE(waiting.ready());
  run_on(runtime_, store->set("pending", bytes("y")));
  EXPECT_EQ(waiting.get(), bytes("y"));
}

TEST_P(AnyStore, ConcurrentAddsFromSeveralClientsSumExactly) {
  constexpr int kClients = 8;
  // On etcd every add to one key is a race its other writers lose and retry (one round trip
  // each): 400 at once take seconds there, so it counts 40.
  const int adds_each = GetParam() == Backend::etcd ? 5 : 50;
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(connect());
  std::vector<Future<std::int64_t>> adds;
  for (int round = 0; round < adds_each; ++round) {
    for (auto& client : clients) adds.push_back(runtime_.spawn(client->add("counter", 2)));
  }
  std::vector<std::int64_t> results;
  for (auto& add : adds) results.push_back(add.get());
  std::sort(results.begin(), results.end());
  // Each add returns the counter right after it: every even number up to the sum, once.
  for (std::size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i], 2 * static_cast<std::int64_t>(i + 1));
  }
  EXPECT_EQ(run_on(runtime_, clients[0]->add("counter", -2 * kClients * adds_each)), 0);
  EXPECT_EQ(run_on(runtime_, clients[0]->add("counter", 42)), 42);
  EXPECT_EQ(run_on(runtime_, clients[1]->get("counter", deadline_after(1s))), bytes("42"));
}

TEST_P(AnyStore, AddToAValueThatIsNotAnIntegerIsAnInvalidArgument) {
  auto store = connect();
  run_on(runtime_, store->set("text", bytes("abc")));
  Error e = error_from(runtime_, store->add("text", 1), Errc::invalid_argument);
  EXPECT_EQ(e.context().operation, "store.add");
  EXPECT_THAT(e.what(), HasSubstr("'text'"));
  EXPECT_EQ(run_on(runtime_, store->add("number", 5)), 5);  // the connection survives
}

TEST_P(AnyStore, CompareSetSwapsOnlyWhenTheCurrentValueIsTheExpectedOne) {
  auto store = connect();
  // Absent counts as equal to an empty `expected`.
  EXPECT_EQ(run_on(runtime_, store->compare_set("leader", {}, bytes("rank0"))), bytes("rank0"));
  // A mismatch leaves the value alone and returns it.
  EXPECT_EQ(run_on(runtime_, store->compare_set("leader", {}, bytes("rank1"))), bytes("rank0"));
  EXPECT_EQ(run_on(runtime_, store->compare_set("leader", bytes("rank2"), bytes("rank1"))),
            bytes("rank0"));
  // A match swaps.
  EXPECT_EQ(run_on(runtime_, store->compare_set("leader", bytes("rank0"), bytes("rank1"))),
            bytes("rank1"));
  EXPECT_EQ(run_on(runtime_, store->get("leader", deadline_after(1s))), bytes("rank1"));
  // Absent with a non-empty `expected`: nothing is stored.
  EXPECT_EQ(run_on(runtime_, store->compare_set("nobody", bytes("x"), bytes("y"))), Bytes{});
  EXPECT_FALSE(run_on(runtime_, store->erase("nobody")));
}

TEST_P(AnyStore, CompareSetWakesAGetWaitingForTheKey) {
  auto store = connect();
  Future<Bytes> waiting = runtime_.spawn(store->get("elected", deadline_after(5s)));
  run_on(runtime_, store->compare_set("elected", {}, bytes("me")));
  EXPECT_EQ(waiting.get(), bytes("me"));
}

TEST_P(AnyStore, EraseRemovesTheKeyAndSaysWhetherItExisted) {
  auto store = connect();
  run_on(runtime_, store->set("k", bytes("v")));
  EXPECT_TRUE(run_on(runtime_, store->erase("k")));
  EXPECT_FALSE(run_on(runtime_, store->erase("k")));
  error_from(runtime_, store->get("k", deadline_after(50ms)), Errc::timeout);
}

TEST_P(AnyStore, WaitReturnsOnceEveryKeyExists) {
  auto waiter = connect();
  auto writer = connect();
  run_on(runtime_, writer->set("ready/0", bytes("1")));
  Future<void> all = runtime_.spawn(
      waiter->wait({"ready/0", "ready/1", "ready/2", "ready/1"}, deadline_after(5s)));
  run_on(runtime_, writer->set("ready/1", bytes("1")));
  EXPECT_FALSE(all.wait_for(30ms));
  run_on(runtime_, writer->set("ready/2", bytes("1")));
  EXPECT_NO_THROW(all.get());
  EXPECT_NO_THROW(run_on(runtime_, waiter->wait({}, deadline_after(1s))));
}

TEST_P(AnyStore, WaitTimesOutWithAnErrorNamingTheKeys) {
  auto store = connect();
  run_on(runtime_, store->set("a", bytes("1")));
  Error e = error_from(runtime_, store->wait({"a", "b"}, deadline_after(80ms)), Errc::timeout);
  EXPECT_EQ(e.context().operation, "store.wait");
  EXPECT_THAT(e.what(), HasSubstr("'a', 'b'"));
}

TEST_F(Store, TheServerAnswersTimeoutToAWaiterWhoseTimeoutPassed) {
  RawPeer raw(server_->port());
  raw.write(proto::encode_request(1, proto::HelloRequest{}));
  EXPECT_EQ(raw.read_frame().opcode, proto::Opcode::ok);
  raw.write(proto::encode_request(2, proto::WaitRequest{{"x", "y"}, 30ms}));
  proto::Frame reply = raw.read_frame();
  EXPECT_EQ(reply.request_id, 2U);
  ASSERT_EQ(reply.opcode, proto::Opcode::error);
  const proto::ErrorReply error = proto::decode_error(reply);
  EXPECT_EQ(error.code, Errc::timeout);
  EXPECT_THAT(error.message, HasSubstr("'x', 'y'"));

  // The connection stays usable after a timeout.
  raw.write(proto::encode_request(3, proto::SetRequest{"x", bytes("1")}));
  EXPECT_EQ(raw.read_frame().request_id, 3U);
}

TEST_P(AnyStore, ManyClientsWithManyOperationsEachSeeConsistentValues) {
  constexpr int kClients = 8;
  constexpr int kKeysEach = 40;
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(connect());
  auto rank_work = [&](int rank) -> asio::awaitable<void> {
    StoreClient& store = *clients[rank];
    for (int i = 0; i < kKeysEach; ++i) {
      co_await store.set(fmt::format("{}/{}", rank, i), bytes(fmt::format("v{}.{}", rank, i)));
      co_await store.add("done", 1);
    }
    // Read every other rank's keys, waiting for those not written yet.
    for (int peer = 0; peer < kClients; ++peer) {
      for (int i = 0; i < kKeysEach; ++i) {
        Bytes value = co_await store.get(fmt::format("{}/{}", peer, i), deadline_after(5s));
        EXPECT_EQ(value, bytes(fmt::format("v{}.{}", peer, i)));
      }
    }
  };
  std::vector<Future<void>> ranks;
  for (int rank = 0; rank < kClients; ++rank) ranks.push_back(runtime_.spawn(rank_work(rank)));
  for (auto& rank : ranks) rank.get();
  EXPECT_EQ(run_on(runtime_, clients[0]->add("done", 0)), kClients * kKeysEach);
}

TEST_P(AnyStore, AwaitablesResumeOnTheCallersExecutor) {
  auto store = connect();
  Runtime elsewhere;
  auto on_other_thread = [&]() -> asio::awaitable<std::vector<bool>> {
    std::vector<bool> resumed_here;
    co_await store->set("from", bytes("elsewhere"));
    resumed_here.push_back(elsewhere.on_runtime_thread());
    Bytes value = co_await store->get("from", deadline_after(1s));
    resumed_here.push_back(elsewhere.on_runtime_thread());
    EXPECT_EQ(value, bytes("elsewhere"));
    co_return resumed_here;
  };
  EXPECT_EQ(elsewhere.spawn(on_other_thread()).get(), std::vector<bool>({true, true}));
  // Asio's post of the last result into `elsewhere` touches it until the post returns on
  // the store's thread; a round trip there guarantees that is over before it is destroyed.
  runtime_.run([] {});
}

TEST_F(Store, AValueOverTheFrameLimitIsRefusedByTheClientAlone) {
  auto store = connect();
  Error e = error_from(runtime_, store->set("huge", Bytes(proto::kMaxFrameBody + 1)),
                       Errc::invalid_argument);
  EXPECT_EQ(e.context().operation, "store.set");
  EXPECT_THAT(e.what(), HasSubstr("64 MiB"));
  run_on(runtime_, store->set("small", bytes("ok")));
  EXPECT_EQ(run_on(runtime_, store->get("small", deadline_after(1s))), bytes("ok"));
}

TEST_F(TokenStore, WrongTokenIsRefusedWhileTheRightOneWorks) {
  Error wrong = error_from(
      runtime_, StoreClient::connect(runtime_.executor(), address("guess"), deadline_after(2s)),
      Errc::refused);
  EXPECT_THAT(wrong.what(), HasSubstr("token"));
  EXPECT_EQ(wrong.context().operation, "store.connect");

  Error missing =
      error_from(runtime_, StoreClient::connect(runtime_.executor(), address(), deadline_after(2s)),
                 Errc::refused);
  EXPECT_THAT(missing.what(), HasSubstr("token"));

  auto store = connect("s3cret");
  run_on(runtime_, store->set("k", bytes("v")));
  EXPECT_EQ(run_on(runtime_, store->get("k", deadline_after(1s))), bytes("v"));
}

TEST_F(TokenStore, RequestsBeforeHelloAreRejectedAndTheConnectionClosed) {
  RawPeer raw(server_->port());
  raw.write(proto::encode_request(7, proto::SetRequest{"k", bytes("sneaky")}));
  std::vector<proto::Frame> replies = frames_in(raw.read_until_closed());
  ASSERT_EQ(replies.size(), 1U);
  EXPECT_EQ(replies[0].opcode, proto::Opcode::error);
  EXPECT_EQ(proto::decode_error(replies[0]).code, Errc::protocol_error);

  auto store = connect("s3cret");
  EXPECT_FALSE(run_on(runtime_, store->erase("k")));
}

TEST_F(Store, GarbageBytesCloseThatConnectionOnly) {
  auto store = connect();
  RawPeer raw(server_->port());
  raw.write(bytes("GET / HTTP/1.1\r\nHost: store\r\n\r\n"));
  std::vector<proto::Frame> replies = frames_in(raw.read_until_closed());
  ASSERT_EQ(replies.size(), 1U);
  EXPECT_EQ(proto::decode_error(replies[0]).code, Errc::protocol_error);
  EXPECT_THAT(proto::decode_error(replies[0]).message, HasSubstr("frame length"));

  run_on(runtime_, store->set("still", bytes("served")));
  EXPECT_EQ(run_on(runtime_, connect()->get("still", deadline_after(1s))), bytes("served"));
}

TEST_F(Store, OversizedFrameLengthClosesThatConnectionBeforeAllocating) {
  auto store = connect();
  RawPeer raw(server_->port());
  raw.write(proto::encode_request(1, proto::HelloRequest{}));
  // 1 GiB announced, a few bytes sent: rejected on the length alone.
  raw.write(Bytes{0x00, 0x00, 0x00, 0x40, 0x02, 0x01});
  std::vector<proto::Frame> replies = frames_in(raw.read_until_closed());
  ASSERT_EQ(replies.size(), 2U);
  EXPECT_EQ(replies[0].opcode, proto::Opcode::ok);  // the hello
  EXPECT_EQ(replies[1].opcode, proto::Opcode::error);
  EXPECT_EQ(proto::decode_error(replies[1]).code, Errc::protocol_error);

  EXPECT_EQ(run_on(runtime_, store->add("alive", 1)), 1);
}

TEST_F(Store, TruncatedFrameClosesThatConnectionAndDropsItsWaiters) {
  auto store = connect();
  RawPeer raw(server_->port());
  raw.write(proto::encode_request(1, proto::HelloRequest{}));
  // A get parked on the server, then a set frame cut short by the peer closing.
  raw.write(proto::encode_request(2, proto::GetRequest{"orphan", 60s}));
  Bytes set = proto::encode_request(3, proto::SetRequest{"k", bytes("value")});
  set.resize(set.size() - 3);
  raw.write(set);
  raw.stop_writing();
  std::vector<proto::Frame> replies = frames_in(raw.read_until_closed());
  ASSERT_EQ(replies.size(), 2U);
  EXPECT_EQ(replies[1].opcode, proto::Opcode::error);
  EXPECT_THAT(proto::decode_error(replies[1]).message, HasSubstr("closed the connection"));

  // Setting the key the dropped peer waited for finds no connection to answer.
  run_on(runtime_, store->set("orphan", bytes("x")));
  EXPECT_FALSE(run_on(runtime_, store->erase("k")));
}

TEST_F(Store, MalformedPayloadClosesThatConnectionOnly) {
  auto store = connect();
  RawPeer raw(server_->port());
  raw.write(proto::encode_request(1, proto::HelloRequest{}));
  // A set whose key length points past the end of the frame.
  raw.write(Bytes{13, 0, 0, 0, 0x02, 9, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0});
  std::vector<proto::Frame> replies = frames_in(raw.read_until_closed());
  ASSERT_EQ(replies.size(), 2U);
  EXPECT_EQ(replies[1].request_id, 9U);
  EXPECT_EQ(proto::decode_error(replies[1]).code, Errc::protocol_error);
  run_on(runtime_, store->set("fine", bytes("1")));
}

TEST_P(AnyStore, DestroyingAClientFailsItsPendingOperationsWithClosed) {
  auto store = connect();
  Future<Bytes> waiting = runtime_.spawn(store->get("forever", deadline_after(5s)));
  EXPECT_FALSE(waiting.wait_for(20ms));
  store.reset();
  try {
    waiting.get();
    FAIL() << "the get outlived its client";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::closed);
    EXPECT_EQ(e.context().operation, "store.get");
  }
  // The server dropped the waiter with the connection; the key can still be set.
  run_on(runtime_, connect()->set("forever", bytes("x")));
}

TEST_F(Store, ClientOperationsFailNamingTheStoreWhenTheServerGoesAway) {
  auto store = connect();
  const std::string where = fmt::format("127.0.0.1:{}", server_->port());
  Future<Bytes> waiting = runtime_.spawn(store->get("never", deadline_after(5s)));
  EXPECT_FALSE(waiting.wait_for(20ms));
  server_.reset();
  try {
    waiting.get();
    FAIL() << "the get survived the server";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::peer_failed);
    EXPECT_THAT(e.what(), HasSubstr(where));
  }
  Error later = error_from(runtime_, store->set("k", bytes("v")), Errc::peer_failed);
  EXPECT_THAT(later.what(), HasSubstr(where));
  EXPECT_EQ(later.context().operation, "store.set");
}

TEST_P(AnyStore, AClientThatDisconnectsWithoutClearingItsWillWakesAGetOnItsKey) {
  auto watcher = connect();
  auto doomed = connect();
  run_on(runtime_, doomed->set_will("failed", bytes("3")));
  Future<Bytes> waiting = runtime_.spawn(watcher->get("failed", deadline_after(5s)));
  EXPECT_FALSE(waiting.wait_for(20ms));
  // Closing the socket without a word is what the kernel does for a killed process.
  doomed.reset();
  EXPECT_EQ(waiting.get(), bytes("3"));
}

TEST_P(AnyStore, AWillDoesNotReplaceAValueTheKeyAlreadyHolds) {
  auto store = connect();
  auto first = connect();
  auto second = connect();
  run_on(runtime_, first->set_will("failed", bytes("1")));
  run_on(runtime_, second->set_will("failed", bytes("2")));
  first.reset();
  EXPECT_EQ(run_on(runtime_, store->get("failed", deadline_after(5s))), bytes("1"));
  second.reset();
  // Nothing to wait on for a will that changes nothing: give the server time to see the
  // close (if it has not, the test passes without having tested, it never fails falsely).
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(run_on(runtime_, store->get("failed", deadline_after(1s))), bytes("1"));
}

TEST_P(AnyStore, ASecondSetWillReplacesTheFirst) {
  auto store = connect();
  auto doomed = connect();
  run_on(runtime_, doomed->set_will("old", bytes("x")));
  run_on(runtime_, doomed->set_will("new", bytes("y")));
  doomed.reset();
  EXPECT_EQ(run_on(runtime_, store->get("new", deadline_after(5s))), bytes("y"));
  EXPECT_FALSE(run_on(runtime_, store->erase("old")));
}

TEST_P(AnyStore, AClearedWillDoesNotFireWhenTheClientIsDestroyed) {
  auto store = connect();
  auto leaving = connect();
  run_on(runtime_, leaving->set_will("failed", bytes("1")));
  run_on(runtime_, leaving->clear_will());
  leaving.reset();
  // A get that outlasts the close: had the will fired, it would return.
  Error e = error_from(runtime_, store->get("failed", deadline_after(300ms)), Errc::timeout);
  EXPECT_THAT(e.what(), HasSubstr("'failed'"));
}

TEST_P(AnyStore, AppendKeepsEveryEntryInOrderAndTheKeyCountsThem) {
  auto store = connect();
  auto other = connect();
  EXPECT_EQ(run_on(runtime_, store->append("log", bytes("first"))), 0);
  EXPECT_EQ(run_on(runtime_, other->append("log", bytes("second"))), 1);
  EXPECT_EQ(run_on(runtime_, store->get("log/0", deadline_after(1s))), bytes("first"));
  EXPECT_EQ(run_on(runtime_, store->get("log/1", deadline_after(1s))), bytes("second"));
  EXPECT_EQ(run_on(runtime_, store->get("log", deadline_after(1s))), bytes("2"));
}

TEST_P(AnyStore, AReaderWaitingForTheNextEntryWakesWhenItIsAppended) {
  auto reader = connect();
  auto writer = connect();
  Future<Bytes> next = runtime_.spawn(reader->get("log/0", deadline_after(5s)));
  EXPECT_FALSE(next.wait_for(20ms));
  run_on(runtime_, writer->append("log", bytes("news")));
  EXPECT_EQ(next.get(), bytes("news"));
}

TEST_P(AnyStore, AppendToAKeyThatHoldsNoCountIsAnInvalidArgument) {
  auto store = connect();
  run_on(runtime_, store->set("log", bytes("not a count")));
  Error e = error_from(runtime_, store->append("log", bytes("x")), Errc::invalid_argument);
  EXPECT_THAT(e.what(), HasSubstr("'log'"));
}

TEST_P(AnyStore, EveryAppendingWillThatFiresIsKeptInTheOrderTheyFired) {
  auto store = connect();
  auto first = connect();
  auto second = connect();
  run_on(runtime_, first->set_appending_will("deaths", bytes("1")));
  run_on(runtime_, second->set_appending_will("deaths", bytes("2")));
  first.reset();
  EXPECT_EQ(run_on(runtime_, store->get("deaths/0", deadline_after(5s))), bytes("1"));
  second.reset();
  EXPECT_EQ(run_on(runtime_, store->get("deaths/1", deadline_after(5s))), bytes("2"));
}

// A client with a key prefix lives in a namespace of its own: every key it names, its
// waits and its will are under the prefix, so two starts of one job (braid-run's
// generations) share a store without seeing each other's keys.
TEST_P(AnyStore, AClientsKeysAndItsWillLieUnderItsPrefix) {
  auto root = connect();
  auto first = connect("g/0/");
  auto second = connect("g/1/");
  run_on(runtime_, first->set("rank", bytes("claimed")));
  EXPECT_EQ(run_on(runtime_, root->get("g/0/rank", deadline_after(1s))), bytes("claimed"));
  EXPECT_EQ(run_on(runtime_, second->add("rank", 1)), 1);  // its own key: g/1/rank
  EXPECT_EQ(run_on(runtime_, first->append("events", bytes("F1"))), 0);
  EXPECT_EQ(run_on(runtime_, root->get("g/0/events/0", deadline_after(1s))), bytes("F1"));
  run_on(runtime_, root->set("g/1/ready", bytes("yes")));
  run_on(runtime_, second->wait({"ready"}, deadline_after(1s)));
  Error e = error_from(runtime_, first->get("ready", deadline_after(100ms)), Errc::timeout);
  EXPECT_THAT(e.what(), HasSubstr("'g/0/ready'"));  // errors name the whole key
  run_on(runtime_, second->set_will("end", bytes("R")));
  second.reset();
  EXPECT_EQ(run_on(runtime_, root->get("g/1/end", deadline_after(5s))), bytes("R"));
}

TEST(StoreConnect, RetriesUntilAServerThatStartsLateComesUp) {
  Runtime runtime;
  const std::uint16_t port = find_free_port();
  Future<std::unique_ptr<StoreClient>> connecting = runtime.spawn(
      StoreClient::connect(runtime.executor(), {"127.0.0.1", port, ""}, deadline_after(5s)));
  EXPECT_FALSE(connecting.wait_for(100ms));
  StoreServer server(runtime, {.host = "127.0.0.1", .port = port});
  auto store = connecting.get();
  run_on(runtime, store->set("k", bytes("v")));
  EXPECT_EQ(run_on(runtime, store->get("k", deadline_after(1s))), bytes("v"));
}

TEST(StoreConnect, TimesOutNamingHostAndPortWhenNobodyListens) {
  Runtime runtime;
  const std::uint16_t port = find_free_port();
  Error e = error_from(
      runtime,
      StoreClient::connect(runtime.executor(), {"127.0.0.1", port, ""}, deadline_after(150ms)),
      Errc::timeout);
  EXPECT_EQ(e.context().operation, "store.connect");
  EXPECT_THAT(e.what(), HasSubstr(fmt::format("127.0.0.1:{}", port)));
}

TEST(StoreServerListen, ABusyPortIsAnErrorNamingTheAddress) {
  Runtime runtime;
  StoreServer first(runtime, {.host = "127.0.0.1"});
  try {
    StoreServer second(runtime, {.host = "127.0.0.1", .port = first.port()});
    FAIL() << "two servers bound one port";
  } catch (const Error& e) {
    EXPECT_EQ(e.context().operation, "store.listen");
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("127.0.0.1:{}", first.port())));
  }
}

}  // namespace
}  // namespace braid::transport
