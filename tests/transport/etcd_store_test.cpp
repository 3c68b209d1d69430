// The store on an etcd cluster where it differs from braid's own: it survives a member's
// loss, a process's will fires when its lease runs out rather than when a connection
// closes, and with every member gone it fails within BRAID_NETWORK_TIMEOUT, naming them.
// What both stores promise alike is held in store_test.cpp (AnyStore), on both.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/core/runtime.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/store/store.hpp>

#include "etcd_test_cluster.hpp"
#include "store_test_helpers.hpp"

namespace braid::transport {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

std::unique_ptr<StoreClient> connect(Runtime& runtime, StoreAddress address) {
  return run_on(runtime,
                StoreClient::connect(runtime.executor(), std::move(address), deadline_after(15s)));
}

TEST(EtcdStore, AThreeMemberClusterServesOnWithAnyOneMemberGone) {
  EtcdTestCluster etcd(3);
  Runtime runtime;
  auto store = connect(runtime, etcd.address("survivor/"));
  auto other = connect(runtime, etcd.address("survivor/"));
  run_on(runtime, store->set("before", bytes("1")));
  // A get parked on a watch when its member goes: it carries on at another.
  Future<Bytes> waiting = runtime.spawn(other->get("after", deadline_after(30s)));
  EXPECT_FALSE(waiting.wait_for(100ms));
  etcd.stop_member(0);  // the member every client asks first
  run_on(runtime, store->set("after", bytes("2")));
  EXPECT_EQ(waiting.get(), bytes("2"));
  EXPECT_EQ(run_on(runtime, store->add("count", 3)), 3);
  EXPECT_EQ(run_on(runtime, other->add("count", 4)), 7);
  EXPECT_EQ(run_on(runtime, other->compare_set("leader", {}, bytes("me"))), bytes("me"));
  EXPECT_EQ(run_on(runtime, store->get("before", deadline_after(5s))), bytes("1"));
  // A client that starts now finds the two members left.
  auto late = connect(runtime, etcd.address("survivor/"));
  EXPECT_EQ(run_on(runtime, late->get("count", deadline_after(5s))), bytes("7"));
}

// A process killed outright revokes nothing: its lease runs out (BRAID_ETCD_TTL, here 2 s,
// etcd's minimum), and a client still alive carries out its will.
TEST(EtcdStore, AKilledProcesssWillFiresOnceItsLeaseRunsOut) {
  ::setenv("BRAID_ETCD_TTL", "2", 1);
  EtcdTestCluster etcd(1);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t doomed = ::fork();
  ASSERT_GE(doomed, 0);
  if (doomed == 0) {
    Runtime runtime;
    auto store = connect(runtime, etcd.address("wills/"));
    run_on(runtime, store->set_appending_will("deaths", bytes("child")));
    const char one = '1';
    ssize_t ignored = ::write(ready[1], &one, 1);
    static_cast<void>(ignored);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char one = 0;
  ASSERT_EQ(::read(ready[0], &one, 1), 1) << "the child could not set its will";
  ::close(ready[0]);
  Runtime runtime;
  auto watcher = connect(runtime, etcd.address("wills/"));
  const auto killed = Clock::now();
  ::kill(doomed, SIGKILL);
  int status = 0;
  ::waitpid(doomed, &status, 0);
  EXPECT_EQ(run_on(runtime, watcher->get("deaths/0", deadline_after(15s))), bytes("child"));
  EXPECT_LT(Clock::now() - killed, 10s);
  EXPECT_EQ(run_on(runtime, watcher->get("deaths", deadline_after(1s))), bytes("1"));
}

// A will written by a process that died while nobody was watching fires when the next
// client starts.
TEST(EtcdStore, AWillWhoseWriterDiedUnwatchedFiresWhenTheNextClientStarts) {
  ::setenv("BRAID_ETCD_TTL", "2", 1);
  EtcdTestCluster etcd(1);
  const pid_t doomed = ::fork();
  ASSERT_GE(doomed, 0);
  if (doomed == 0) {
    Runtime runtime;
    auto store = connect(runtime, etcd.address("alone/"));
    run_on(runtime, store->set_will("failed", bytes("alone")));
    ::raise(SIGKILL);
  }
  int status = 0;
  ::waitpid(doomed, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  Runtime runtime;
  auto next = connect(runtime, etcd.address("alone/"));
  EXPECT_EQ(run_on(runtime, next->get("failed", deadline_after(15s))), bytes("alone"));
}

TEST(EtcdStore, WithEveryMemberGoneOperationsFailWithinTheNetworkTimeoutNamingThem) {
  ::setenv("BRAID_NETWORK_TIMEOUT", "1", 1);
  {
    EtcdTestCluster etcd(1);
    Runtime runtime;
    auto store = connect(runtime, etcd.address("lost/"));
    run_on(runtime, store->set("k", bytes("v")));
    etcd.stop_member(0);
    const auto started = Clock::now();
    try {
      run_on(runtime, store->add("k2", 1));
      ADD_FAILURE() << "an add succeeded with no member left";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::peer_failed) << e.what();
      EXPECT_EQ(e.context().operation, "store.add");
      EXPECT_THAT(e.what(), HasSubstr(etcd.members()[0]));
    }
    EXPECT_LT(Clock::now() - started, 8s);
  }
  ::unsetenv("BRAID_NETWORK_TIMEOUT");
}

TEST(EtcdStore, ConnectToAClusterThatNeverAnswersTimesOutNamingIt) {
  Runtime runtime;
  StoreAddress nowhere;
  nowhere.etcd_members = {fmt::format("127.0.0.1:{}", find_free_port())};
  nowhere.etcd_namespace = "none/";
  try {
    run_on(runtime, StoreClient::connect(runtime.executor(), nowhere, deadline_after(500ms)));
    ADD_FAILURE() << "connected to nobody";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(nowhere.etcd_members[0]));
  }
}

TEST(EtcdUrl, NamesMembersAndTheJobsNamespace) {
  std::optional<EtcdAddress> address =
      parse_etcd_url("etcd://198.18.0.1:2379,[::1]:2380/my-job", "BRAID_STORE");
  ASSERT_TRUE(address);
  EXPECT_EQ(address->members, (std::vector<std::string>{"198.18.0.1:2379", "[::1]:2380"}));
  EXPECT_EQ(address->key_namespace, "my-job/");
  EXPECT_EQ(format_etcd_url(*address), "etcd://198.18.0.1:2379,[::1]:2380/my-job");
  EXPECT_EQ(parse_etcd_url("etcd://h:1", "BRAID_STORE")->key_namespace, "braid/");
  EXPECT_FALSE(parse_etcd_url("127.0.0.1:29500", "BRAID_STORE"));
}

TEST(EtcdUrl, AMalformedMemberIsAnErrorNamingTheVariable) {
  for (const char* url : {"etcd://", "etcd:///job", "etcd://h:notaport/job", "etcd://h:1,/job"}) {
    try {
      parse_etcd_url(url, "BRAID_STORE");
      ADD_FAILURE() << url << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_environment) << url;
      EXPECT_THAT(e.what(), HasSubstr("BRAID_STORE")) << url;
    }
  }
}

}  // namespace
}  // namespace braid::transport
