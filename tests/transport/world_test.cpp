// World end to end: real processes joining through the store and talking over UCX, and
// ranks as threads in one process. Programs come from the build through the environment:
// BRAID_RUN (the launcher), RING (examples/ring), WORLD_PROBE (world_probe.cpp).
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/transport/world.hpp>

#include "../support/child_process.hpp"

namespace braid::transport {
namespace {

using braid::testing::ChildProcess;
using braid::testing::Env;
using braid::testing::program_from_env;
using braid::testing::run_child;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string braid_run() {
  return program_from_env("BRAID_RUN");
}
std::string ring() {
  return program_from_env("RING");
}
std::string probe() {
  return program_from_env("WORLD_PROBE");
}

// The environment braid-run would give rank `rank` of `size`.
Env rank_env(int rank, int size, std::uint16_t port, const std::string& token = "t0ken") {
  return {{"BRAID_RANK", std::to_string(rank)},
          {"BRAID_WORLD_SIZE", std::to_string(size)},
          {"BRAID_STORE", "127.0.0.1:" + std::to_string(port)},
          {"BRAID_TOKEN", token}};
}

// Two world probes in `mode`, started together; the rank that ends first (`first`, the one
// the mode kills or fails) is waited for before the other.
struct ProbePair {
  braid::testing::Outcome first, survivor;
};
ProbePair run_probe_pair(const std::string& mode, int first) {
  const auto port = find_free_port();
  ChildProcess rank0({probe(), mode}, rank_env(0, 2, port), 40s);
  ChildProcess rank1({probe(), mode}, rank_env(1, 2, port), 40s);
  ProbePair outcomes;
  outcomes.first = (first == 0 ? rank0 : rank1).wait();
  outcomes.survivor = (first == 0 ? rank1 : rank0).wait();
  return outcomes;
}

TEST(WorldProcesses, TheRingExamplePassesItsTokenAroundFourRanksUnderBraidRun) {
  auto result = run_child({braid_run(), "-n", "4", "--timeout", "60", ring(), "2"});
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  EXPECT_THAT(result.out, HasSubstr("[0] rank 0: the token came back as 12 after 2 lap(s) of 4 "
                                    "rank(s); expected 12"));
  for (int r = 1; r < 4; ++r) {
    EXPECT_THAT(result.out, HasSubstr(fmt::format("[{}] rank {} of 4 passed the token on", r, r)));
  }
}

TEST(WorldProcesses, TheRingWorksOverTcpAlone) {
  auto result =
      run_child({braid_run(), "-n", "3", "--timeout", "60", ring(), "3"}, {{"UCX_TLS", "tcp"}});
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  EXPECT_THAT(result.out, HasSubstr("the token came back as 9 after 3 lap(s) of 3 rank(s)"));
}

TEST(WorldProcesses, AKilledRankFailsItsPeersPendingReceiveNamingIt) {
  auto [dead, survivor] = run_probe_pair("die-after-ready", 1);
  EXPECT_EQ(dead.status, 128 + SIGKILL) << dead.err;
  EXPECT_EQ(survivor.status, 3) << survivor.out << survivor.err;
  EXPECT_THAT(survivor.err, HasSubstr("rank 0: recv (peer rank 1"));
  EXPECT_THAT(survivor.err, HasSubstr("peer failed"));
  // Well inside the receive's own 60 s deadline: the failure was detected, not timed out.
  EXPECT_LT(survivor.elapsed, 20s);
}

TEST(WorldProcesses, AKilledStoreHostFailsItsPeersPendingReceiveNamingRankZero) {
  auto [dead, survivor] = run_probe_pair("host-dies-after-ready", 0);
  EXPECT_EQ(dead.status, 128 + SIGKILL) << dead.err;
  EXPECT_EQ(survivor.status, 3) << survivor.out << survivor.err;
  EXPECT_THAT(survivor.err, HasSubstr("rank 1: recv (peer rank 0"));
  EXPECT_THAT(survivor.err, HasSubstr("peer failed"));
  EXPECT_LT(survivor.elapsed, 20s);
}

// A rank leaving through an error (an exception past its World) announces its failure:
// a peer waiting on it learns at once, rather than at its deadline (60 s here).
TEST(WorldProcesses, ARankLeavingThroughAnErrorFailsItsPeersWaitAtOnceNamingIt) {
  auto [failing, survivor] = run_probe_pair("throw-after-join", 1);
  EXPECT_EQ(failing.status, 3) << failing.err;
  EXPECT_THAT(failing.err, HasSubstr("error: rank 1 gave up"));
  EXPECT_EQ(survivor.status, 3) << survivor.out << survivor.err;
  EXPECT_THAT(survivor.err, HasSubstr("rank 0: recv (peer rank 1"));
  EXPECT_THAT(survivor.err, HasSubstr("peer failed: it left the job through an error"));
  EXPECT_LT(survivor.elapsed, 10s);
}

// Without a launcher nobody knows a rank that never reached the store is dead: the others
// say whom they wait for while they wait, and the error at the deadline names the ranks
// and BRAID_TIMEOUT.
TEST(WorldProcesses, RanksThatNeverJoinAreNamedWhileWaitingAndWithBraidTimeoutAtTheEnd) {
  const auto port = find_free_port();
  Env env = rank_env(0, 3, port);
  env["BRAID_TIMEOUT"] = "3";
  auto alone = ChildProcess({probe(), "join"}, env).wait();
  EXPECT_EQ(alone.status, 3) << alone.err;
  EXPECT_THAT(alone.err, HasSubstr("waiting for rank(s) 1-2 of 3 to join"));
  EXPECT_THAT(alone.err, HasSubstr("ranks 1-2 of 3 never joined"));
  EXPECT_THAT(alone.err, HasSubstr("within BRAID_TIMEOUT=3 s"));
  EXPECT_LT(alone.elapsed, 10s);
  // Rank 0 never came, so neither did its store.
  env = rank_env(1, 3, find_free_port());
  env["BRAID_TIMEOUT"] = "3";
  alone = ChildProcess({probe(), "join"}, env).wait();
  EXPECT_EQ(alone.status, 3) << alone.err;
  EXPECT_THAT(alone.err, HasSubstr("still waiting for the job's store"));
  EXPECT_THAT(alone.err, HasSubstr("rank 0 never served the store"));
  EXPECT_THAT(alone.err, HasSubstr("BRAID_TIMEOUT=3 s"));
  EXPECT_LT(alone.elapsed, 10s);
}

// braid-run sees its child die, wherever it was: a rank killed before it reached the store
// stops the job at once, named with its signal, not after BRAID_TIMEOUT (60 s here).
TEST(WorldProcesses, BraidRunNamesARankKilledBeforeItJoinedAndStopsTheJob) {
  auto result =
      run_child({braid_run(), "-n", "2", "/bin/bash", "-c",
                 "if [ \"$BRAID_RANK\" = 1 ]; then kill -9 $$; fi; exec \"$0\" join", probe()},
                {{"BRAID_TIMEOUT", "60"}});
  EXPECT_EQ(result.status, 128 + SIGKILL) << result.err;
  EXPECT_THAT(result.err, HasSubstr("braid-run: rank 1 (pid "));
  EXPECT_THAT(result.err, HasSubstr("was killed by signal 9 (SIGKILL)"));
  EXPECT_LT(result.elapsed, 10s) << result.err;
}

// A rank that reached the store and died before publishing its address: its will fires,
// and the ranks waiting for its address fail at once naming it. (A store client with the
// rank's will stands in for the dying rank.)
TEST(WorldThreads, ARankThatDiesAfterReachingTheStoreFailsTheJoinAtOnce) {
  const auto port = find_free_port();
  const LaunchInfo launch{.rank = 0,
                          .world_size = 2,
                          .local_rank = 0,
                          .local_world_size = 2,
                          .store_host = "127.0.0.1",
                          .store_port = port,
                          .token = "wills",
                          .source = "test"};
  Runtime runtime({.rank = 0});
  World::Options options;
  options.join_timeout = 30s;
  auto joining =
      std::async(std::launch::async, [&] { return World::join(runtime, launch, options); });
  Runtime other({.rank = 1});
  other
      .spawn([](asio::any_io_executor executor, std::uint16_t port) -> asio::awaitable<void> {
        StoreAddress address{.host = "127.0.0.1", .port = port, .token = "wills"};
        auto store =
            co_await StoreClient::connect(executor, std::move(address), deadline_after(10s));
        std::string key = "braid/world/events";
        Bytes rank{'F', '1'};
        co_await store->set_appending_will(std::move(key), std::move(rank));
      }(other.executor(), port))
      .get();  // the client and its connection are gone: the will fires
  const auto started = Clock::now();
  try {
    joining.get();
    ADD_FAILURE() << "rank 0 joined without rank 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::peer_failed) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("rank 1 failed while the job was joining"));
  }
  EXPECT_LT(Clock::now() - started, 10s);
}

TEST(WorldProcesses, ARankFailingAfterJoinStopsTheOthersAndBraidRunNamesIt) {
  auto result = run_child({braid_run(), "-n", "2", "--timeout", "60", probe(), "fail-after-join"});
  EXPECT_EQ(result.status, 3) << result.out << result.err;
  EXPECT_THAT(result.err, HasSubstr("rank 1"));
  EXPECT_THAT(result.err, HasSubstr("exited with code 3"));
  EXPECT_LT(result.elapsed, 30s);
}

TEST(WorldProcesses, ARankWithTheWrongTokenIsRefusedAtJoin) {
  const auto port = find_free_port();
  Env quick{{"BRAID_TIMEOUT", "3"}};
  Env env0 = rank_env(0, 2, port, "right");
  Env env1 = rank_env(1, 2, port, "wrong");
  env0.insert(quick.begin(), quick.end());
  env1.insert(quick.begin(), quick.end());
  ChildProcess rank0({probe(), "join"}, env0);
  ChildProcess rank1({probe(), "join"}, env1);
  auto stranger = rank1.wait();
  auto host = rank0.wait();
  EXPECT_EQ(stranger.status, 3);
  EXPECT_THAT(stranger.err, HasSubstr("refused"));
  // Rank 0 never hears from rank 1 and says which key it waited for.
  EXPECT_EQ(host.status, 3);
  EXPECT_THAT(host.err, HasSubstr("timed out"));
  EXPECT_THAT(host.err, HasSubstr("ucx_address/1"));
}

TEST(WorldProcesses, AMalformedEnvironmentIsAnErrorNamingTheVariable) {
  auto result = run_child({ring()}, {{"BRAID_RANK", "one"}, {"BRAID_WORLD_SIZE", "2"}});
  EXPECT_EQ(result.status, 1);
  EXPECT_THAT(result.err, HasSubstr("BRAID_RANK='one' is not an integer"));
  // A trace knob is checked at join too, before anything connects.
  Env env = rank_env(0, 1, 1);
  env["BRAID_TRACE_BUFFER_MB"] = "0";
  result = run_child({ring()}, env);
  EXPECT_EQ(result.status, 1);
  EXPECT_THAT(result.err, HasSubstr("BRAID_TRACE_BUFFER_MB=0 must be a positive number of MiB"));
  // A zero timeout would fail the first wait, naming the wait and not the variable.
  env = rank_env(0, 1, 1);
  env["BRAID_TIMEOUT"] = "0";
  result = run_child({ring()}, env);
  EXPECT_EQ(result.status, 1);
  EXPECT_THAT(result.err, HasSubstr("BRAID_TIMEOUT='0' must be a positive number of seconds"));
}

TEST(WorldThreads, ThreeRanksAsThreadsExchangeMessagesThroughTheWorld) {
  constexpr int kSize = 3;
  const auto port = find_free_port();
  std::vector<std::int64_t> received(kSize, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kSize; ++r) {
    ranks.emplace_back([&, r] {
      Runtime runtime({.rank = r});
      LaunchInfo launch{.rank = r,
                        .world_size = kSize,
                        .local_rank = r,
                        .local_world_size = kSize,
                        .store_host = "127.0.0.1",
                        .store_port = port,
                        .token = "threads",
                        .source = "test"};
      auto world = World::join(runtime, launch);
      EXPECT_EQ(world->rank(), r);
      EXPECT_EQ(world->size(), kSize);
      std::int64_t out = 100 + r;
      std::int64_t in = 0;
      runtime
          .spawn([](World& w, Buffer send, Buffer recv) -> asio::awaitable<void> {
            const int next = (w.rank() + 1) % w.size();
            const int prev = (w.rank() + w.size() - 1) % w.size();
            co_await w.send(next, send, 5);
            co_await w.recv(prev, recv, 5);
          }(*world, Buffer(&out, 1, DType::i64), Buffer(&in, 1, DType::i64)))
          .get();
      received[static_cast<std::size_t>(r)] = in;
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(received, (std::vector<std::int64_t>{102, 100, 101}));
}

// The names of this process's threads (/proc/self/task/*/comm), one per thread.
std::vector<std::string> thread_names() {
  std::vector<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    names.push_back(name);
  }
  return names;
}

TEST(WorldThreads, RankZeroServesTheStoreOnAThreadOfItsOwnNotItsRuntimes) {
  // What strangers send the store must not queue ahead of rank 0's communication.
  const auto port = find_free_port();
  const auto store_threads = [] {
    const auto names = thread_names();
    return std::count(names.begin(), names.end(), "braid-store");
  };
  const auto before = store_threads();
  {
    Runtime runtime({.rank = 0});
    auto world = World::join(runtime, LaunchInfo{.rank = 0,
                                                 .world_size = 1,
                                                 .store_host = "127.0.0.1",
                                                 .store_port = port,
                                                 .source = "test"});
    EXPECT_EQ(store_threads(), before + 1);
  }
  EXPECT_EQ(store_threads(), before) << "the store's thread ends with the World";
}

TEST(WorldThreads, ASecondClaimantOfATakenRankIsRefusedAtJoinAndTheWorldCarriesOn) {
  constexpr int kSize = 2;
  const auto port = find_free_port();
  auto launch = [&](int r) {
    return LaunchInfo{.rank = r,
                      .world_size = kSize,
                      .local_rank = r,
                      .local_world_size = kSize,
                      .store_host = "127.0.0.1",
                      .store_port = port,
                      .token = "claims",
                      .source = "test"};
  };
  std::promise<void> both_joined_promise;
  std::shared_future<void> both_joined = both_joined_promise.get_future().share();
  std::promise<void> impostor_done_promise;
  std::shared_future<void> impostor_done = impostor_done_promise.get_future().share();
  std::atomic<int> joined{0};
  std::vector<std::int64_t> received(kSize, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kSize; ++r) {
    ranks.emplace_back([&, r] {
      Runtime runtime({.rank = r});
      auto world = World::join(runtime, launch(r));
      if (++joined == kSize) both_joined_promise.set_value();
      impostor_done.wait();
      std::int64_t out = 10 + r;
      std::int64_t in = 0;
      runtime
          .spawn([](World& w, Buffer send, Buffer recv) -> asio::awaitable<void> {
            co_await w.send(1 - w.rank(), send, 9);
            co_await w.recv(1 - w.rank(), recv, 9);
          }(*world, Buffer(&out, 1, DType::i64), Buffer(&in, 1, DType::i64)))
          .get();
      received[static_cast<std::size_t>(r)] = in;
    });
  }
  both_joined.wait();
  {
    Runtime runtime({.rank = 1});
    World::Options options;
    options.join_timeout = 5s;
    options.leave_timeout = 1s;
    try {
      World::join(runtime, launch(1), options);
      ADD_FAILURE() << "a second process joined as rank 1";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::refused) << e.what();
      EXPECT_THAT(e.what(), HasSubstr("rank 1 is already taken"));
    }
  }
  impostor_done_promise.set_value();
  for (auto& t : ranks) t.join();
  // The refused claimant left no will behind: the real ranks still talk.
  EXPECT_EQ(received, (std::vector<std::int64_t>{11, 10}));
}

}  // namespace
}  // namespace braid::transport
