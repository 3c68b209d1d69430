// UCX point-to-point transport. Ranks are threads, each with its own Runtime and
// UcxWorker, addresses exchanged in memory; the killed-peer test starts a real process
// (ucx_test_peer). The same tests run twice: with UCX's default transports (shared memory,
// cma) as ucx_test and with UCX_TLS=tcp as ucx_tcp_test (see meson.build).
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <signal.h>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <ucs/type/status.h>

#include <braid/core/log.hpp>
#include <braid/core/runtime.hpp>
#include <braid/trace/recorder.hpp>
#include <braid/transport/ucx/tag.hpp>
#include <braid/transport/ucx/ucx_error.hpp>
#include <braid/transport/ucx/ucx_worker.hpp>

namespace braid::transport {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// N ranks in this process, connected to each other.
struct World {
  explicit World(int size, UcxWorker::Options options = {}) {
    std::vector<Bytes> addresses;
    for (int r = 0; r < size; ++r) {
      runtimes.push_back(std::make_unique<Runtime>(Runtime::Options{.rank = r}));
      workers.push_back(std::make_unique<UcxWorker>(*runtimes[r], options));
      addresses.push_back(workers[r]->address());
    }
    for (int r = 0; r < size; ++r) workers[r]->connect(addresses, r);
  }

  template <class T>
  Future<T> spawn(int rank, asio::awaitable<T> work) {
    return runtimes[rank]->spawn(std::move(work));
  }

  UcxWorker& operator[](int rank) { return *workers[rank]; }

  // Declared first so that every worker is destroyed before its runtime.
  std::vector<std::unique_ptr<Runtime>> runtimes;
  std::vector<std::unique_ptr<UcxWorker>> workers;
};

std::vector<std::uint8_t> pattern(std::size_t bytes, std::uint8_t seed) {
  std::vector<std::uint8_t> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::uint8_t>(seed + i * 7);
  return out;
}

Deadline soon() {
  return deadline_after(10s);
}

// Runs `work` and returns the braid::Error it throws; fails the test if it throws none.
template <class T>
Error error_of(Future<T> future) {
  try {
    future.get();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "the operation succeeded";
  return Error(Errc::invalid_argument, "no error");
}

TEST(UcxTag, FieldsRoundTripAndSequenceAndStepWrapWithinTheirFields) {
  const Tag tag{.communicator = 17, .sequence = (std::uint64_t{1} << 40) + 3, .step = 4096 + 9};
  const WireTag wire = decode_tag(encode_tag(tag, 123456));
  EXPECT_EQ(wire, (WireTag{.communicator = 17, .source = 123456, .sequence = 3, .step = 9}));
}

TEST(UcxTag, TagsDifferingInAnyOneFieldDiffer) {
  const Tag base{.communicator = 1, .sequence = 2, .step = 3};
  const auto wire = encode_tag(base, 4);
  EXPECT_NE(wire, encode_tag({.communicator = 2, .sequence = 2, .step = 3}, 4));
  EXPECT_NE(wire, encode_tag({.communicator = 1, .sequence = 3, .step = 3}, 4));
  EXPECT_NE(wire, encode_tag({.communicator = 1, .sequence = 2, .step = 4}, 4));
  EXPECT_NE(wire, encode_tag(base, 5));
}

TEST(UcxError, CategoryNamesTheUcxStatus) {
  const std::error_code code = make_ucx_error_code(UCS_ERR_NO_MEMORY);
  EXPECT_STREQ(code.category().name(), "ucx");
  EXPECT_EQ(code.message(), ucs_status_string(UCS_ERR_NO_MEMORY));
  EXPECT_EQ(code, std::errc::not_enough_memory);
  EXPECT_EQ(make_ucx_error_code(UCS_ERR_ENDPOINT_TIMEOUT), std::errc::timed_out);
}

TEST(UcxError, CheckThrowsWithTheCallAndContextAndPassesSuccess) {
  EXPECT_NO_THROW(BRAID_UCX_CHECK(UCS_OK, {}));
  EXPECT_NO_THROW(BRAID_UCX_CHECK(UCS_INPROGRESS, {}));
  try {
    BRAID_UCX_CHECK(UCS_ERR_INVALID_PARAM, {.rank = 2, .operation = "setup"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_ucx_error_code(UCS_ERR_INVALID_PARAM));
    EXPECT_EQ(e.context().rank, 2);
    EXPECT_THAT(e.what(), HasSubstr("UCS_ERR_INVALID_PARAM"));
    EXPECT_THAT(e.what(), HasSubstr(ucs_status_string(UCS_ERR_INVALID_PARAM)));
  }
}

TEST(UcxP2p, RingPassesAMessageAroundFourRanks) {
  World world(4);
  auto pass_on = [](UcxWorker& w) -> asio::awaitable<std::vector<int>> {
    const int size = w.size(), next = (w.rank() + 1) % size, prev = (w.rank() + size - 1) % size;
    std::vector<int> visited;
    if (w.rank() == 0) {
      visited.push_back(0);
      co_await w.send(next, Buffer(visited), {.sequence = 0}, soon());
    }
    visited.assign(size, -1);
    std::size_t bytes = co_await w.recv(prev, Buffer(visited), {.sequence = 0}, soon());
    visited.resize(bytes / sizeof(int));
    if (w.rank() != 0) {
      visited.push_back(w.rank());
      co_await w.send(next, Buffer(visited), {.sequence = 0}, soon());
    }
    co_return visited;
  };
  std::vector<Future<std::vector<int>>> results;
  for (int r = 0; r < 4; ++r) results.push_back(world.spawn(r, pass_on(world[r])));
  EXPECT_THAT(results[0].get(), ::testing::ElementsAre(0, 1, 2, 3));
  for (int r = 1; r < 4; ++r) EXPECT_EQ(results[r].get().size(), static_cast<std::size_t>(r + 1));
}

class UcxP2pSizes : public ::testing::TestWithParam<std::size_t> {};

TEST_P(UcxP2pSizes, ReceiverGetsEveryByteAndTheSize) {
  World world(2);
  const std::size_t bytes = GetParam();
  std::vector<std::uint8_t> sent = pattern(bytes, 3), received(bytes + 16, 0);
  // The receive is posted first for half the messages and after arrival for the other,
  // so both the expected and the unexpected paths of eager and rendezvous are taken.
  for (bool receive_first : {true, false}) {
    std::fill(received.begin(), received.end(), 0);
    Future<std::size_t> recv;
    if (receive_first) recv = world.spawn(1, world[1].recv(0, Buffer(received), {}, soon()));
    auto send = world.spawn(0, world[0].send(1, Buffer(sent), {}, soon()));
    if (!receive_first) {
      std::this_thread::sleep_for(20ms);  // the message (or its rendezvous request) arrives first
      recv = world.spawn(1, world[1].recv(0, Buffer(received), {}, soon()));
    }
    send.get();
    EXPECT_EQ(recv.get(), bytes);
    EXPECT_TRUE(std::equal(sent.begin(), sent.end(), received.begin()));
  }
}

INSTANTIATE_TEST_SUITE_P(EagerAndRendezvous, UcxP2pSizes,
                         ::testing::Values(0, 8, 64 << 10, 4 << 20),
                         [](const auto& info) { return fmt::format("{}Bytes", info.param); });

// A large message sent eagerly (UCX_RNDV_THRESH=inf, as a user may set it) travels in
// fragments; when all of them have arrived before the receive is posted, UCX completes the
// receive inside the call that posts it and still hands back a request. The receive
// reports the message once, whole.
TEST(UcxP2p, AReceiveCompletedWhileItIsPostedGetsTheWholeEagerMessage) {
  const char* before = std::getenv("UCX_RNDV_THRESH");
  const std::string saved = before != nullptr ? before : "";
  ::setenv("UCX_RNDV_THRESH", "inf", 1);
  World world(2);
  if (before != nullptr) {
    ::setenv("UCX_RNDV_THRESH", saved.c_str(), 1);
  } else {
    ::unsetenv("UCX_RNDV_THRESH");
  }
  constexpr std::size_t bytes = 1 << 20;
  for (int round = 0; round < 4; ++round) {
    std::vector<std::uint8_t> sent = pattern(bytes, static_cast<std::uint8_t>(round)),
                              received(bytes, 0);
    const Tag tag{.sequence = static_cast<std::uint64_t>(round)};
    auto send = world.spawn(0, world[0].send(1, Buffer(sent), tag, soon()));
    send.get();                         // eager: complete once the fragments are out
    std::this_thread::sleep_for(20ms);  // and on the receiver's side, unexpected
    auto recv = world.spawn(1, world[1].recv(0, Buffer(received), tag, soon()));
    EXPECT_EQ(recv.get(), bytes) << "round " << round;
    EXPECT_EQ(received, sent) << "round " << round;
  }
}

TEST(UcxP2p, ManyInFlightOperationsMatchByTagWhicheverOrderTheyArePostedIn) {
  World world(2);
  constexpr int count = 48;
  // Every eighth message is large enough for rendezvous.
  auto size_of = [](int i) -> std::size_t { return i % 8 == 0 ? 256 << 10 : 64 + i; };
  std::vector<std::vector<std::uint8_t>> sent, received;
  for (int i = 0; i < count; ++i) {
    sent.push_back(pattern(size_of(i), static_cast<std::uint8_t>(i)));
    received.emplace_back(size_of(i));
  }
  std::vector<Future<std::size_t>> recvs(count);
  // Receives posted in reverse, half before the sends and half after.
  for (int i = count - 1; i >= count / 2; --i) {
    recvs[i] = world.spawn(
        1, world[1].recv(0, Buffer(received[i]), {.sequence = std::uint64_t(i)}, soon()));
  }
  std::vector<Future<void>> sends;
  for (int i = 0; i < count; ++i) {
    sends.push_back(
        world.spawn(0, world[0].send(1, Buffer(sent[i]), {.sequence = std::uint64_t(i)}, soon())));
  }
  for (int i = count / 2 - 1; i >= 0; --i) {
    recvs[i] = world.spawn(
        1, world[1].recv(0, Buffer(received[i]), {.sequence = std::uint64_t(i)}, soon()));
  }
  for (int i = 0; i < count; ++i) {
    sends[i].get();
    EXPECT_EQ(recvs[i].get(), size_of(i)) << "message " << i;
    EXPECT_EQ(received[i], sent[i]) << "message " << i;
  }
}

// A receive whose message is on its way polls the worker in place before it suspends
// (ucx_progress.cpp): a ping-pong's replies mostly complete that way. Each reply carries
// the count so far, and a receive suspended the whole time on the same rank, whose message
// comes in the middle of the exchange (found by one of those in-place polls or by the
// progress loop), still gets it.
TEST(UcxP2p, PingPongRepliesAndAReceiveWaitingBesideThemAllArrive) {
  World world(2);
  constexpr std::int64_t kRoundTrips = 2000;
  std::int64_t beside = 0;
  auto waiting =
      world.spawn(1, world[1].recv(0, Buffer(&beside, 1, DType::i64), {.sequence = 7}, soon()));
  auto pinger = [&]() -> asio::awaitable<std::int64_t> {
    std::int64_t value = 0;
    for (std::int64_t i = 0; i < kRoundTrips; ++i) {
      if (i == kRoundTrips / 2) {
        std::int64_t marker = 42;
        co_await world[0].send(1, Buffer(&marker, 1, DType::i64), {.sequence = 7}, soon());
      }
      co_await world[0].send(1, Buffer(&value, 1, DType::i64), {.sequence = 0}, soon());
      co_await world[0].recv(1, Buffer(&value, 1, DType::i64), {.sequence = 0}, soon());
    }
    co_return value;
  };
  auto ponger = [&]() -> asio::awaitable<std::int64_t> {
    std::int64_t value = 0;
    for (std::int64_t i = 0; i < kRoundTrips; ++i) {
      co_await world[1].recv(0, Buffer(&value, 1, DType::i64), {.sequence = 0}, soon());
      ++value;
      co_await world[1].send(0, Buffer(&value, 1, DType::i64), {.sequence = 0}, soon());
    }
    co_return value;
  };
  auto pinged = world.spawn(0, pinger());
  auto ponged = world.spawn(1, ponger());
  EXPECT_EQ(pinged.get(), kRoundTrips);
  EXPECT_EQ(ponged.get(), kRoundTrips);
  EXPECT_EQ(waiting.get(), sizeof(std::int64_t));
  EXPECT_EQ(beside, 42);
}

TEST(UcxP2p, ReceivesMatchTheirSourceRankWhenTagsAreEqual) {
  World world(3);
  std::uint64_t from1 = 0, from2 = 0, one = 111, two = 222;
  // Posted for rank 2 first; rank 1's message must not land there.
  auto recv2 = world.spawn(0, world[0].recv(2, Buffer(&from2, 1, DType::i64), {}, soon()));
  world.spawn(1, world[1].send(0, Buffer(&one, 1, DType::i64), {}, soon())).get();
  auto recv1 = world.spawn(0, world[0].recv(1, Buffer(&from1, 1, DType::i64), {}, soon()));
  world.spawn(2, world[2].send(0, Buffer(&two, 1, DType::i64), {}, soon())).get();
  EXPECT_EQ(recv1.get(), 8u);
  EXPECT_EQ(recv2.get(), 8u);
  EXPECT_EQ(from1, 111u);
  EXPECT_EQ(from2, 222u);
}

TEST(UcxP2p, ARankCanSendToItself) {
  World world(1);
  std::uint64_t out = 7, in = 0;
  auto recv = world.spawn(0, world[0].recv(0, Buffer(&in, 1, DType::i64), {}, soon()));
  world.spawn(0, world[0].send(0, Buffer(&out, 1, DType::i64), {}, soon())).get();
  EXPECT_EQ(recv.get(), 8u);
  EXPECT_EQ(in, 7u);
}

TEST(UcxP2p, MessagesAreTracedAsTransportSpansWithPeerSequenceAndBytes) {
  World world(2);
  std::vector<std::uint8_t> sent = pattern(100, 3), received(256);
  trace::clear();
  trace::set_enabled(true);
  auto recv = world.spawn(1, world[1].recv(0, Buffer(received), {.sequence = 9}, soon()));
  world.spawn(0, world[0].send(1, Buffer(sent), {.sequence = 9}, soon())).get();
  EXPECT_EQ(recv.get(), 100u);
  trace::set_enabled(false);

  std::vector<std::string> names;
  const trace::Record* recv_span = nullptr;
  const trace::Record* send_span = nullptr;
  std::vector<const trace::Record*> wait_spans;
  const trace::Snapshot snapshot = trace::snapshot();
  for (const auto& record : snapshot.records) {
    if (record.category != trace::Category::transport) continue;
    // A transfer that suspended has a wait span inside it (whether the receive or the
    // send suspends depends on which runtime thread runs first).
    if (std::string_view(record.name) == "ucx.wait") {
      wait_spans.push_back(&record);
      continue;
    }
    if (std::string_view(record.name) == "ucx.recv") recv_span = &record;
    if (std::string_view(record.name) == "ucx.send") send_span = &record;
    names.emplace_back(record.name);
    EXPECT_EQ(record.bytes, 100u) << record.name;  // a receive records what arrived
    ASSERT_EQ(record.arg_count, 2);
    EXPECT_STREQ(record.args[0].key, "peer");
    EXPECT_EQ(record.args[0].value, names.back() == "ucx.send" ? 1 : 0);
    EXPECT_EQ(record.args[1].value, 9);
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ucx.recv", "ucx.send"}));
  ASSERT_NE(recv_span, nullptr);
  ASSERT_NE(send_span, nullptr);
  const auto within = [](const trace::Record* inner, const trace::Record* outer) {
    return outer->begin_ns <= inner->begin_ns && inner->end_ns <= outer->end_ns;
  };
  for (const trace::Record* wait : wait_spans) {
    EXPECT_TRUE(within(wait, recv_span) || within(wait, send_span))
        << "a ucx.wait span lies outside the transfer it waited for";
  }
  trace::clear();
}

TEST(UcxP2p, ReceiveBufferSmallerThanTheMessageFailsWithSizeMismatchNamingPeerAndSizes) {
  World world(2);
  for (std::size_t bytes : {std::size_t{64}, std::size_t{1} << 20}) {
    std::vector<std::uint8_t> sent = pattern(bytes, 1), small(8);
    const Tag tag{.sequence = bytes};
    auto recv = world.spawn(1, world[1].recv(0, Buffer(small), tag, soon()));
    auto send = world.spawn(0, world[0].send(1, Buffer(sent), tag, soon()));
    Error e = error_of(std::move(recv));
    EXPECT_EQ(e.code(), Errc::size_mismatch);
    EXPECT_EQ(e.context().peer, 0);
    EXPECT_EQ(e.context().sequence, bytes);
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("is {} bytes", bytes)));
    EXPECT_THAT(e.what(), HasSubstr("holds 8 bytes"));
    send.wait();
  }
}

// A reply usually lands while its receive polls in place: an error found there (here a
// reply longer than the buffer) is thrown to the receiver just as one found later is.
TEST(UcxP2p, AnOversizedReplyFoundWhilePollingInPlaceFailsWithSizeMismatch) {
  World world(2);
  constexpr int kRounds = 50;
  auto pinger = [&]() -> asio::awaitable<int> {
    int mismatches = 0;
    for (int i = 0; i < kRounds; ++i) {
      std::uint64_t request = 1, reply = 0;
      const Tag tag{.sequence = static_cast<std::uint64_t>(i)};
      co_await world[0].send(1, Buffer(&request, 1, DType::i64), tag, soon());
      try {
        co_await world[0].recv(1, Buffer(&reply, 1, DType::i64), tag, soon());
      } catch (const Error& e) {
        if (e.code() == Errc::size_mismatch && e.context().peer == 1) ++mismatches;
      }
    }
    co_return mismatches;
  };
  auto ponger = [&]() -> asio::awaitable<void> {
    for (int i = 0; i < kRounds; ++i) {
      std::uint64_t request = 0;
      std::vector<std::uint8_t> reply = pattern(64, 5);
      const Tag tag{.sequence = static_cast<std::uint64_t>(i)};
      co_await world[1].recv(0, Buffer(&request, 1, DType::i64), tag, soon());
      co_await world[1].send(0, Buffer(reply), tag, soon());
    }
  };
  auto pinged = world.spawn(0, pinger());
  auto ponged = world.spawn(1, ponger());
  ponged.get();
  EXPECT_EQ(pinged.get(), kRounds);
}

TEST(UcxP2p, ReceiveWithNoSenderTimesOutNamingPeerAndTag) {
  World world(2);
  std::uint64_t value = 0;
  const auto start = Clock::now();
  Error e = error_of(world.spawn(
      0, world[0].recv(1, Buffer(&value, 1, DType::i64),
                       {.communicator = 3, .sequence = 41, .step = 2}, deadline_after(50ms))));
  EXPECT_GE(Clock::now() - start, 50ms);
  EXPECT_EQ(e.code(), Errc::timeout);
  EXPECT_EQ(e.context().rank, 0);
  EXPECT_EQ(e.context().peer, 1);
  EXPECT_EQ(e.context().operation, "recv");
  EXPECT_EQ(e.context().sequence, 41u);
  EXPECT_THAT(e.what(), HasSubstr("communicator 3, sequence 41, step 2"));
  // The worker is still usable: a later message with the same tag arrives.
  value = 0;
  std::uint64_t five = 5;
  auto recv = world.spawn(0, world[0].recv(1, Buffer(&value, 1, DType::i64),
                                           {.communicator = 3, .sequence = 41, .step = 2}, soon()));
  world
      .spawn(1, world[1].send(0, Buffer(&five, 1, DType::i64),
                              {.communicator = 3, .sequence = 41, .step = 2}, soon()))
      .get();
  EXPECT_EQ(recv.get(), 8u);
  EXPECT_EQ(value, 5u);
}

TEST(UcxP2p, RendezvousSendWithNoReceiverTimesOutAndThePeerThenCountsAsFailed) {
  UcxWorker::Options options;
  options.close_timeout = 100ms;  // rank 1 cannot flush to the closed endpoint; do not wait long
  World world(2, options);
  std::vector<std::uint8_t> big = pattern(4 << 20, 9);
  Error e = error_of(
      world.spawn(0, world[0].send(1, Buffer(big), {.sequence = 5}, deadline_after(50ms))));
  EXPECT_EQ(e.code(), Errc::timeout);
  EXPECT_EQ(e.context().peer, 1);
  EXPECT_EQ(e.context().operation, "send");
  EXPECT_EQ(e.context().sequence, 5u);
  // The buffer is UCX's no longer: the test may free it now.
  big.clear();
  big.shrink_to_fit();
  std::uint64_t value = 1;
  Error later =
      error_of(world.spawn(0, world[0].send(1, Buffer(&value, 1, DType::i64), {}, soon())));
  EXPECT_EQ(later.code(), Errc::peer_failed);
  EXPECT_THAT(later.what(), HasSubstr("passed its deadline"));
}

TEST(UcxP2p, CudaBuffersAreRejectedWithAClearError) {
  World world(2);
  std::uint64_t storage = 0;
  Buffer device_buffer(&storage, 1, DType::i64, MemoryKind::cuda, 0);
  Error e = error_of(world.spawn(0, world[0].send(1, device_buffer, {}, soon())));
  EXPECT_EQ(e.code(), Errc::invalid_argument);
  EXPECT_THAT(e.what(), HasSubstr("cuda memory"));
  EXPECT_EQ(error_of(world.spawn(0, world[0].recv(1, device_buffer, {}, soon()))).code(),
            Errc::invalid_argument);
}

TEST(UcxP2p, PeersOutsideTheWorldAndOversizedCommunicatorIdsAreRejected) {
  World world(2);
  std::uint64_t value = 0;
  EXPECT_EQ(
      error_of(world.spawn(0, world[0].send(2, Buffer(&value, 1, DType::i64), {}, soon()))).code(),
      Errc::invalid_argument);
  EXPECT_EQ(error_of(world.spawn(0, world[0].recv(1, Buffer(&value, 1, DType::i64),
                                                  {.communicator = max_communicators}, soon())))
                .code(),
            Errc::invalid_argument);
}

TEST(UcxP2p, DestroyingTheWorkerFailsPendingReceivesWithClosed) {
  Runtime runtime({.rank = 0});
  auto worker = std::make_unique<UcxWorker>(runtime);
  worker->connect({worker->address()}, 0);
  std::uint64_t value = 0;
  auto recv = runtime.spawn(worker->recv(0, Buffer(&value, 1, DType::i64), {}, soon()));
  // Let the receive be posted before the worker goes.
  runtime.run([] {});
  worker.reset();
  EXPECT_EQ(error_of(std::move(recv)).code(), Errc::closed);
}

// ---------------------------------------------------------------- a peer process dies

std::string hex(const Bytes& bytes) {
  return fmt::format("{:02x}", fmt::join(bytes, ""));
}

Bytes from_hex(const std::string& text) {
  Bytes out;
  for (std::size_t i = 0; i + 1 < text.size(); i += 2) {
    out.push_back(static_cast<std::uint8_t>(std::stoi(text.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// ucx_test_peer as rank 1, connected to rank 0 through two pipes.
class PeerProcess {
 public:
  explicit PeerProcess(const Bytes& parent_address) {
    const char* path = std::getenv("BRAID_UCX_TEST_PEER");
    BRAID_ENFORCE(path != nullptr, "BRAID_UCX_TEST_PEER is not set (run through meson test)");
    int to_child[2], from_child[2];
    BRAID_ENFORCE(pipe(to_child) == 0 && pipe(from_child) == 0, "pipe() failed");
    pid_ = fork();
    BRAID_ENFORCE(pid_ >= 0, "fork() failed");
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec: this process has threads.
      dup2(to_child[0], STDIN_FILENO);
      dup2(from_child[1], STDOUT_FILENO);
      close(to_child[1]);
      close(from_child[0]);
      execl(path, path, static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    const std::string line = hex(parent_address) + "\n";
    BRAID_ENFORCE(write(to_child[1], line.data(), line.size()) == static_cast<ssize_t>(line.size()),
                  "writing to the peer failed");
    close(to_child[1]);
    std::string reply;
    char c;
    while (read(from_child[0], &c, 1) == 1 && c != '\n') reply += c;
    close(from_child[0]);
    address_ = from_hex(reply);
  }
  ~PeerProcess() {
    if (pid_ > 0) kill_now();
  }

  const Bytes& address() const { return address_; }

  void kill_now() {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  Bytes address_;
};

TEST(UcxPeerFailure, AKilledPeerFailsPendingOperationsNamingItsRank) {
  Runtime runtime({.rank = 0});
  UcxWorker::Options options;
  options.keepalive_interval = 200ms;
  UcxWorker worker(runtime, options);
  PeerProcess peer(worker.address());
  ASSERT_FALSE(peer.address().empty()) << "the peer process did not start";
  worker.connect({worker.address(), peer.address()}, 0);

  std::uint64_t hello = 0;
  ASSERT_EQ(
      runtime.spawn(worker.recv(1, Buffer(&hello, 1, DType::i64), {.sequence = 0}, soon())).get(),
      8u);
  EXPECT_EQ(hello, 42u);

  // A receive the peer will never satisfy, and a rendezvous send it will never receive.
  std::uint64_t never = 0;
  std::vector<std::uint8_t> big(4 << 20, 1);
  auto recv = runtime.spawn(
      worker.recv(1, Buffer(&never, 1, DType::i64), {.sequence = 1}, deadline_after(20s)));
  auto send = runtime.spawn(worker.send(1, Buffer(big), {.sequence = 2}, deadline_after(20s)));
  runtime.run([] {});
  const auto killed_at = Clock::now();
  peer.kill_now();

  for (Error e : {error_of(std::move(recv)), error_of(std::move(send))}) {
    EXPECT_EQ(e.code(), Errc::peer_failed) << e.what();
    EXPECT_EQ(e.context().peer, 1);
    EXPECT_EQ(e.context().rank, 0);
    EXPECT_THAT(e.what(), HasSubstr("peer rank 1"));
  }
  const auto detected_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed_at);
  EXPECT_LT(detected_ms, 10s);
  std::printf("[   INFO   ] peer failure detected %lld ms after SIGKILL (UCX_TLS=%s)\n",
              static_cast<long long>(detected_ms.count()),
              std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "default");
  // Later operations with the dead peer fail at once.
  auto later =
      runtime.spawn(worker.recv(1, Buffer(&never, 1, DType::i64), {.sequence = 3}, soon()));
  EXPECT_EQ(error_of(std::move(later)).code(), Errc::peer_failed);
}

}  // namespace
}  // namespace braid::transport
