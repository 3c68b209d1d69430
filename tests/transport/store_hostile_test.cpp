// The store under strangers and misbehaving clients: what one may make the server hold,
// how long a connection may wait before its hello, how many may wait at once, and that a
// rank cannot be claimed twice. Everything runs over loopback with bounded counts and
// times; the strangers are plain POSIX sockets (one descriptor each), so a test that
// counts descriptors knows what it spends.
#include <algorithm>
#include <arpa/inet.h>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <netinet/in.h>
#include <optional>
#include <poll.h>
#include <random>
#include <string>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/core/runtime.hpp>
#include <braid/transport/store/store.hpp>

#include "store_test_helpers.hpp"
#include "transport/rank_claim.hpp"
#include "transport/store/store_protocol.hpp"

namespace braid::transport {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
namespace proto = store_protocol;

// A little-endian length prefix announcing `length` bytes, then one byte of them.
Bytes announce(std::uint32_t length, std::uint8_t then = 0x02) {
  return Bytes{static_cast<std::uint8_t>(length), static_cast<std::uint8_t>(length >> 8),
               static_cast<std::uint8_t>(length >> 16), static_cast<std::uint8_t>(length >> 24),
               then};
}

// A TCP connection to the server that writes whatever it is told: one file descriptor.
class Stranger {
 public:
  // nullopt when no descriptor was left for the socket.
  static std::optional<Stranger> connect(std::uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      EXPECT_TRUE(errno == EMFILE || errno == ENFILE) << std::strerror(errno);
      return std::nullopt;
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int connected = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
    EXPECT_EQ(connected, 0) << std::strerror(errno);
    return Stranger(fd);
  }
  Stranger(Stranger&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Stranger& operator=(Stranger&&) = delete;
  ~Stranger() {
    if (fd_ >= 0) ::close(fd_);
  }

  void write(const Bytes& data) {
    // The server may close the connection meanwhile; a stranger does not care.
    (void)::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
  }

  // Waits up to `limit` for the server to close the connection, discarding what it sends.
  // True if it closed.
  bool closed_within(Clock::duration limit) {
    const Deadline deadline = Clock::now() + limit;
    std::array<char, 4096> sink{};
    for (;;) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left <= 0ms) return false;
      pollfd ready{.fd = fd_, .events = POLLIN, .revents = 0};
      if (::poll(&ready, 1, static_cast<int>(left.count())) <= 0) continue;
      const ssize_t n = ::recv(fd_, sink.data(), sink.size(), 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    }
  }

 private:
  explicit Stranger(int fd) : fd_(fd) {}
  int fd_;
};

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t size = 0;
  std::size_t resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

class GuardedStore : public ::testing::Test {
 protected:
  void start(StoreServer::Options options) {
    options.host = "127.0.0.1";
    options.token = "s3cret";
    server_.emplace(runtime_, std::move(options));
  }
  std::uint16_t port() const { return server_->port(); }
  std::unique_ptr<StoreClient> connect(Deadline deadline = deadline_after(5s)) {
    return run_on(runtime_, StoreClient::connect(runtime_.executor(),
                                                 {"127.0.0.1", port(), "s3cret"}, deadline));
  }
  // A stranger that has passed hello with the right token.
  Stranger insider() {
    Stranger s = *Stranger::connect(port());
    s.write(proto::encode_request(1, proto::HelloRequest{"s3cret"}));
    return s;
  }

  Runtime runtime_;
  std::optional<StoreServer> server_;
};

TEST_F(GuardedStore, ALegitimateClientIsServedPromptlyWhileStrangersSendJunkAndHoldNoMemory) {
  start({.hello_timeout = 2s, .max_unauthenticated = 16});
  auto client = connect();
  run_on(runtime_, client->set("warm", bytes("up")));

  // The legitimate client keeps going for the whole test, timing each round trip.
  std::atomic<bool> done{false};
  std::atomic<int> rounds{0};
  Clock::duration slowest{};
  std::thread legitimate([&] {
    for (int i = 0; !done; ++i) {
      const auto started = Clock::now();
      run_on(runtime_, client->set("k", bytes(std::to_string(i))));
      EXPECT_EQ(run_on(runtime_, client->get("k", deadline_after(5s))), bytes(std::to_string(i)));
      slowest = std::max(slowest, Clock::now() - started);
      ++rounds;
    }
  });

  testing::internal::CaptureStderr();
  const std::size_t resident_before = resident_bytes();
  const unsigned seed = 20240531;
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 random(seed);
  auto some_bytes = [&](std::size_t n) {
    Bytes out(n);
    for (auto& b : out) b = static_cast<std::uint8_t>(random());
    return out;
  };
  enum Kind {
    huge_before_hello,
    huge_after_hello,
    noise,
    noise_after_hello,
    truncated_hello,
    idle
  };
  std::vector<Kind> kinds;
  kinds.insert(kinds.end(), 50, huge_before_hello);
  kinds.insert(kinds.end(), 50, huge_after_hello);
  kinds.insert(kinds.end(), 30, noise);
  kinds.insert(kinds.end(), 20, noise_after_hello);
  kinds.insert(kinds.end(), 30, truncated_hello);
  kinds.insert(kinds.end(), 40, idle);  // more than max_unauthenticated
  std::shuffle(kinds.begin(), kinds.end(), random);

  std::vector<Stranger> strangers;
  const Bytes hello = proto::encode_request(1, proto::HelloRequest{"s3cret"});
  for (const Kind kind : kinds) {
    switch (kind) {
      case huge_before_hello:
        strangers.push_back(*Stranger::connect(port()));
        strangers.back().write(announce(random() % 2 ? 64U << 20 : 0xffffffffU));
        break;
      case huge_after_hello:
        strangers.push_back(insider());
        strangers.back().write(announce(random() % 2 ? 64U << 20 : 0xffffffffU));
        break;
      case noise:
        strangers.push_back(*Stranger::connect(port()));
        strangers.back().write(some_bytes(1 + random() % 256));
        break;
      case noise_after_hello:
        strangers.push_back(insider());
        strangers.back().write(some_bytes(1 + random() % 256));
        break;
      case truncated_hello:
        strangers.push_back(*Stranger::connect(port()));
        strangers.back().write(
            Bytes(hello.begin(), hello.begin() + 1 + random() % (hello.size() - 1)));
        break;
      case idle:
        strangers.push_back(*Stranger::connect(port()));
        break;
    }
  }
  // Let the server read everything sent, with every stranger still connected.
  const int rounds_before = rounds;
  while (rounds < rounds_before + 20) std::this_thread::sleep_for(10ms);
  const std::size_t resident_after = resident_bytes();
  done = true;
  legitimate.join();

  // 100 connections announced 64 MiB or 4 GiB; none of it may be allocated.
  EXPECT_LT(resident_after, resident_before + (std::size_t{64} << 20))
      << "resident memory grew from " << resident_before << " to " << resident_after;
  EXPECT_LT(slowest, 1s);
  EXPECT_GT(rounds, 20);
  run_on(runtime_, client->set("after", bytes("still served")));
  EXPECT_EQ(run_on(runtime_, connect()->get("after", deadline_after(1s))), bytes("still served"));

  // What was dropped is summed up, not logged line by line; the server's shutdown writes
  // what it counted since the last summary.
  client.reset();
  server_.reset();
  const std::string log = testing::internal::GetCapturedStderr();
  std::size_t lines = 0;
  for (std::size_t at = log.find("store on port"); at != std::string::npos;
       at = log.find("store on port", at + 1)) {
    ++lines;
  }
  EXPECT_GE(lines, 1U) << log;
  EXPECT_LE(lines, 2U) << log;
  EXPECT_THAT(log, HasSubstr("before hello")) << log;
}

TEST_F(GuardedStore, FramesOrRepliesThatWouldTakeTheBuffersPastTheirLimitCloseTheirConnection) {
  start({.buffer_limit = std::size_t{1} << 20});
  auto client = connect();
  const Bytes value(256 << 10, 0x5a);
  run_on(runtime_, client->set("big", value));

  // A frame announced at 4 MiB, of which 2 MiB arrive: the buffer outgrows the budget.
  Stranger sender = insider();
  Bytes frame = announce(4U << 20);
  frame.resize(2U << 20, 0x01);
  sender.write(frame);
  EXPECT_TRUE(sender.closed_within(3s));

  // 100 gets of a 256 KiB value, their replies left unread: they pile up past the budget.
  Stranger greedy = insider();
  Bytes gets;
  for (std::uint64_t id = 2; id < 102; ++id) {
    const Bytes get = proto::encode_request(id, proto::GetRequest{"big", 1s});
    gets.insert(gets.end(), get.begin(), get.end());
  }
  greedy.write(gets);
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(greedy.closed_within(3s));

  // Everything held for them went back to the budget.
  EXPECT_EQ(run_on(runtime_, client->get("big", deadline_after(1s))), value);
}

TEST_F(GuardedStore, AConnectionWithoutAHelloIsClosedAtTheHelloDeadline) {
  start({.hello_timeout = 300ms});
  const auto started = Clock::now();
  Stranger silent = *Stranger::connect(port());
  Stranger halfway = *Stranger::connect(port());
  halfway.write(Bytes{20, 0, 0});  // three bytes of a length prefix, then nothing
  EXPECT_TRUE(silent.closed_within(3s));
  EXPECT_TRUE(halfway.closed_within(3s));
  EXPECT_GE(Clock::now() - started, 250ms);
  EXPECT_LT(Clock::now() - started, 2s);

  // A client that says hello at once stays, past the deadline.
  auto client = connect();
  std::this_thread::sleep_for(400ms);
  run_on(runtime_, client->set("k", bytes("v")));
}

TEST_F(GuardedStore, APastTheCapStrangerClosesTheOldestAndALegitimateClientStillGetsIn) {
  start({.hello_timeout = 30s, .max_unauthenticated = 4});
  std::vector<Stranger> idle;
  for (int i = 0; i < 6; ++i) idle.push_back(*Stranger::connect(port()));
  // The two oldest made way for the two newest.
  EXPECT_TRUE(idle[0].closed_within(2s));
  EXPECT_TRUE(idle[1].closed_within(2s));
  EXPECT_FALSE(idle[5].closed_within(100ms));

  auto client = connect(deadline_after(3s));
  run_on(runtime_, client->set("in", bytes("yes")));
  EXPECT_TRUE(idle[2].closed_within(2s));  // the client's connection, briefly a stranger too
}

// Strangers in another process open many more connections than this process may hold
// descriptors, the way 1,050 idle connections under ulimit -n 1024 did; then the process
// itself runs out. The server keeps only max_unauthenticated strangers, and gives up the
// oldest one's descriptor when an accept fails for want of one, so a rank still gets in;
// what happened is summed up in a line or two, not a line per failure.
TEST_F(GuardedStore, ALegitimateClientGetsInWhileStrangersFloodAProcessOutOfDescriptors) {
  start({.hello_timeout = 30s, .max_unauthenticated = 8});
  const std::string where = fmt::format("port {}", port());
  constexpr int kStrangers = 100;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t flood = ::fork();
  ASSERT_GE(flood, 0);
  if (flood == 0) {
    // The child: system calls only, then wait to be killed.
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port());
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < kStrangers; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
        ::_exit(1);
      }
    }
    const char byte = 1;
    (void)!::write(ready[1], &byte, 1);
    for (;;) ::pause();
  }
  struct Reap {
    pid_t child;
    ~Reap() {
      ::kill(child, SIGKILL);
      ::waitpid(child, nullptr, 0);
    }
  } reap{flood};
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1) << "the child could not open its connections";
  ::close(ready[0]);

  testing::internal::CaptureStderr();  // its file needs a descriptor: taken before the limit
  rlimit original{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &original), 0);
  int highest = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    highest = std::max(highest, std::stoi(entry.path().filename().string()));
  }
  std::vector<int> spare;  // this process's own descriptors, filling what is left
  struct Restore {
    rlimit limit;
    std::vector<int>& spare;
    ~Restore() {
      for (int fd : spare) ::close(fd);
      ::setrlimit(RLIMIT_NOFILE, &limit);
    }
  } restore{original, spare};
  rlimit lowered = original;
  lowered.rlim_cur = static_cast<rlim_t>(highest + 1 + 24);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lowered), 0);

  // The server works through the strangers waiting to be accepted.
  std::this_thread::sleep_for(300ms);
  for (int fd; spare.size() < 10000 && (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) {
    spare.push_back(fd);
  }
  ASSERT_FALSE(spare.empty()) << "the strangers took every descriptor";
  ::close(spare.back());  // one for the client's own socket
  spare.pop_back();

  auto client = connect(deadline_after(3s));
  run_on(runtime_, client->set("in", bytes("yes")));
  EXPECT_EQ(run_on(runtime_, client->get("in", deadline_after(1s))), bytes("yes"));

  client.reset();
  server_.reset();
  const std::string log = testing::internal::GetCapturedStderr();
  std::size_t lines = 0;
  for (std::size_t at = log.find(where); at != std::string::npos; at = log.find(where, at + 1)) {
    ++lines;
  }
  EXPECT_LE(lines, 2U) << log;
}

TEST(StoreToken, ATokenFillingAHelloWorksAndALongerOneIsRefusedByTheClient) {
  Runtime runtime;
  const std::string longest(proto::kMaxTokenBytes, 't');
  StoreServer server(runtime, {.host = "127.0.0.1", .token = longest});
  auto connect = [&](std::string token) {
    return run_on(runtime, StoreClient::connect(runtime.executor(),
                                                {"127.0.0.1", server.port(), std::move(token)},
                                                deadline_after(2s)));
  };
  run_on(runtime, connect(longest)->set("k", bytes("v")));
  try {
    connect(longest + "t");
    FAIL() << "a token longer than a hello may carry was sent";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("at most {}", proto::kMaxTokenBytes)));
  }
}

TEST(RankClaim, ASecondClaimOfATakenRankIsRefusedNamingTheRank) {
  Runtime runtime;
  StoreServer server(runtime, {.host = "127.0.0.1", .token = "t"});
  auto connect = [&] {
    return run_on(runtime,
                  StoreClient::connect(runtime.executor(), {"127.0.0.1", server.port(), "t"},
                                       deadline_after(5s)));
  };
  auto first = connect();
  auto second = connect();
  run_on(runtime, claim_rank(*first, 1));
  run_on(runtime, claim_rank(*second, 0));  // another rank is free
  try {
    run_on(runtime, claim_rank(*second, 1));
    FAIL() << "rank 1 was claimed twice";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::refused) << e.what();
    EXPECT_EQ(e.context().rank, 1);
    EXPECT_THAT(e.what(), HasSubstr("rank 1 is already taken"));
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("pid {}", ::getpid())));
  }
}

}  // namespace
}  // namespace braid::transport
