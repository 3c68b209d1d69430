// A rank that fault_injection_test runs: it joins the World from the environment, runs
// kSteps steps of what PLACE names on the world communicator, and on rank DOOMED leaves at
// the start of step kFailStep in the way MODE names, while its peers go on:
//
//   fault_probe MODE PLACE DOOMED
//
//   MODE   kill    SIGKILL itself
//          throw   throw a C++ exception, which unwinds through the World
//          exit    std::exit(3): no destructor runs, the process just ends
//          return  end its program early and cleanly, as a rank given fewer steps does
//   PLACE  all_reduce  every rank all-reduces 64 KiB
//          barrier     every rank enters a barrier
//          all_gather  every rank all-gathers 16 KiB (FSDP's parameter gather)
//          store_wait  every rank makes a subgroup of all ranks, the doomed one named first:
//                      the others wait in the store for the name it hands out
//          recv        the doomed rank sends 4 KiB to every other rank, which receives
//          send        every other rank sends 1 MiB to the doomed rank (past UCX's
//                      rendezvous threshold: the send needs the receiver)
//          chain       (4 ranks, DOOMED 2) ranks 2 and 3 all-reduce on a communicator of
//                      their own, then rank 3 sends to rank 1, which receives; rank 0 only
//                      ends: rank 2's exit fails rank 3, whose failure must reach rank 1
//
// The doomed rank prints "doomed_at_ns=<CLOCK_MONOTONIC>" on stderr as it leaves; every
// survivor prints "rank R saw: <what>" and "exited_at_ns=<CLOCK_MONOTONIC>" after its World
// is gone and exits 3. A rank that finishes every step prints "rank R finished" and exits 0.
// Survivors ignore SIGTERM, so what is tested under braid-run is what they see on their own.
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <braid/braid.hpp>
#include <braid/collectives/communicator.hpp>

namespace {

using braid::Buffer;
using braid::ReduceOp;
using braid::asio::awaitable;
using braid::collectives::Communicator;

constexpr int kSteps = 6;
constexpr int kFailStep = 2;

std::int64_t monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return std::int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

struct Plan {
  std::string mode;
  std::string place;
  int doomed = -1;
};

// Leaves the way the mode says; returns only for "return".
void leave_early(const Plan& plan) {
  std::cerr << fmt::format("doomed_at_ns={}\n", monotonic_ns()) << std::flush;
  if (plan.mode == "kill") std::raise(SIGKILL);
  if (plan.mode == "exit") std::exit(3);
  if (plan.mode == "throw") throw std::runtime_error("an injected failure");
}

awaitable<void> step(Communicator& comm, Communicator* pair, const Plan& plan) {
  const int rank = comm.rank();
  if (plan.place == "all_reduce") {
    std::vector<float> data(16 * 1024, 1.0F);
    co_await comm.all_reduce(Buffer(data), ReduceOp::sum);
  } else if (plan.place == "barrier") {
    co_await comm.barrier();
  } else if (plan.place == "all_gather") {
    std::vector<float> shard(4096, 1.0F);
    std::vector<float> whole(shard.size() * static_cast<std::size_t>(comm.size()));
    co_await comm.all_gather(Buffer(shard), Buffer(whole));
  } else if (plan.place == "store_wait") {
    std::vector<int> members{plan.doomed};
    for (int r = 0; r < comm.size(); ++r) {
      if (r != plan.doomed) members.push_back(r);
    }
    co_await comm.subgroup(members);
  } else if (plan.place == "recv") {
    std::vector<std::uint8_t> message(4096, 7);
    if (rank == plan.doomed) {
      for (int r = 0; r < comm.size(); ++r) {
        if (r != rank) co_await comm.send(Buffer(message), r);
      }
    } else {
      co_await comm.recv(Buffer(message), plan.doomed);
    }
  } else if (plan.place == "send") {
    std::vector<std::uint8_t> message(1 << 20, 7);
    if (rank == plan.doomed) {
      for (int r = 0; r < comm.size(); ++r) {
        if (r != rank) co_await comm.recv(Buffer(message), r);
      }
    } else {
      co_await comm.send(Buffer(message), plan.doomed);
    }
  } else if (plan.place == "chain") {
    std::vector<float> data(1024, 1.0F);
    if (pair != nullptr) co_await pair->all_reduce(Buffer(data), ReduceOp::sum);
    if (rank == 3) co_await comm.send(Buffer(data), 1);
    if (rank == 1) co_await comm.recv(Buffer(data), 3);
  } else {
    throw std::invalid_argument("unknown place " + plan.place);
  }
}

awaitable<void> run(Communicator& comm, Plan plan) {
  // chain: ranks 2 and 3 get a communicator of their own; the others none.
  std::shared_ptr<Communicator> pair;
  if (plan.place == "chain") pair = co_await comm.split(comm.rank() >= 2 ? 0 : -1, comm.rank());
  for (int s = 0; s < kSteps; ++s) {
    if (s == kFailStep && comm.rank() == plan.doomed) {
      leave_early(plan);
      co_return;
    }
    co_await step(comm, pair.get(), plan);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: fault_probe MODE PLACE DOOMED\n";
    return 2;
  }
  const Plan plan{.mode = argv[1], .place = argv[2], .doomed = std::atoi(argv[3])};
  int rank = -1;
  try {
    rank = braid::transport::parse_launch_env().rank;  // for the message, should joining fail
    braid::Runtime runtime;
    auto world = braid::transport::World::join(runtime);
    rank = world->rank();
    if (rank != plan.doomed) std::signal(SIGTERM, SIG_IGN);
    auto comm = Communicator::world(*world);
    runtime.spawn(run(*comm, plan)).get();
  } catch (const std::exception& e) {
    std::cerr << fmt::format("rank {} saw: {}\nexited_at_ns={}\n", rank, e.what(), monotonic_ns());
    return 3;
  }
  std::cout << fmt::format("rank {} finished\n", rank);
  std::cerr << fmt::format("exited_at_ns={}\n", monotonic_ns());
  return 0;
}
