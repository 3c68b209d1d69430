// A rank that collectives_process_test runs under braid-run: it joins the World from the
// environment, takes the world Communicator, and does what its first argument says:
//   check      every collective the communicator has over real processes, with values
//              whose results are known exactly (small integers, exact in f32 too); prints
//              "rank R ok (all_reduce of 1 MiB: ALGORITHM)", or the first mismatch on stderr with
//              exit code 1.
//   die D      all ranks run one all_reduce; then rank D kills itself (SIGKILL) and the
//              others call all_reduce on 4 MiB until it fails. A survivor prints
//              "rank R saw: <what>" on stderr and exits 3; one that never sees a failure
//              says so and exits 1. Survivors ignore SIGTERM: braid-run sends it to them
//              as soon as it reaps rank D, and what is tested is what they see on their
//              own (braid-run still kills them after --grace).
//   link BYTES IFACE
//              one sum all_reduce of BYTES bytes of f32 between barriers; every rank prints
//              "rank R node N: IFACE sent S bytes during an all_reduce of BYTES bytes in
//              T s", S the growth of the network interface's transmit counter
//              (/proc/net/dev, this rank's network namespace) across the all_reduce.
//   die_node N all ranks all_reduce 4 MiB until one fails; after the first, node N's rank
//              of local rank 0 kills its node's braid-run and itself (under braid-run
//              --emulate-nodes, the whole node goes). Survivors report as in die.
//   until_failure
//              as die_node with no node killed: for failures made from outside (a link
//              cut). Every rank prints "rank R looping" after its first all_reduce.
// Other errors are printed as "error: <what>" on stderr, with exit code 2.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include <braid/braid.hpp>
#include <braid/collectives/communicator.hpp>

namespace {

using braid::Buffer;
using braid::ReduceOp;
using braid::asio::awaitable;
using braid::collectives::Communicator;
using namespace std::chrono_literals;

// The first element that differs from what it should be, for one readable message.
struct Mismatch {
  std::string what;

  template <class Values>  // a std::vector or a std::span
  void check(const Values& got, std::size_t i, typename Values::value_type expected,
             const std::string& where) {
    if (what.empty() && got[i] != expected) {
      what = fmt::format("{}: element {} is {}, expected {}", where, i, got[i], expected);
    }
  }
};

// Sum over ranks of (r + 1 + i % 7) is P(P+1)/2 + P * (i % 7).
awaitable<void> check_all_reduce_sum(Communicator& comm, std::size_t count, Mismatch& m) {
  const int P = comm.size();
  std::vector<float> input(count), output(count, -1.0F);
  for (std::size_t i = 0; i < count; ++i) {
    input[i] = static_cast<float>(comm.rank() + 1 + static_cast<int>(i % 7));
  }
  co_await comm.all_reduce(Buffer(input), Buffer(output), ReduceOp::sum);
  const std::string where = fmt::format("all_reduce sum f32 count {}", count);
  for (std::size_t i = 0; i < count; ++i) {
    m.check(output, i, static_cast<float>(P * (P + 1) / 2 + P * static_cast<int>(i % 7)), where);
  }
  co_await comm.all_reduce(Buffer(input), ReduceOp::sum);  // in place
  const std::string in_place = "in place " + where;
  for (std::size_t i = 0; i < count; ++i) m.check(input, i, output[i], in_place);
}

// avg on integers truncates the sum / P toward zero.
awaitable<void> check_all_reduce_avg(Communicator& comm, std::size_t count, Mismatch& m) {
  const int P = comm.size();
  std::vector<std::int32_t> data(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = comm.rank() + static_cast<int>(i % 3);
  co_await comm.all_reduce(Buffer(data), ReduceOp::avg);
  const std::string where = fmt::format("all_reduce avg i32 count {}", count);
  for (std::size_t i = 0; i < count; ++i) {
    m.check(data, i, (P * (P - 1) / 2 + P * static_cast<int>(i % 3)) / P, where);
  }
}

awaitable<void> check_broadcast(Communicator& comm, int root, Mismatch& m) {
  constexpr std::size_t kCount = 10000;
  std::vector<std::int64_t> data(kCount, -1);
  // A local copy: lambdas in a coroutine must not capture its parameters (GCC 12).
  const std::int64_t from = root;
  auto value = [from](std::size_t i) { return from * 1'000'000 + static_cast<std::int64_t>(i); };
  if (comm.rank() == root) {
    for (std::size_t i = 0; i < kCount; ++i) data[i] = value(i);
  }
  co_await comm.broadcast(Buffer(data), root);
  const std::string where = fmt::format("broadcast from root {}", root);
  for (std::size_t i = 0; i < kCount; ++i) m.check(data, i, value(i), where);
}

awaitable<void> check_all_gather(Communicator& comm, Mismatch& m) {
  constexpr std::size_t kCount = 777;
  const auto P = static_cast<std::size_t>(comm.size());
  auto value = [](std::size_t rank, std::size_t i) {
    return static_cast<std::int64_t>(rank * 1'000'000 + i);
  };
  std::vector<std::int64_t> input(kCount), output(kCount * P, -1);
  const auto me = static_cast<std::size_t>(comm.rank());
  for (std::size_t i = 0; i < kCount; ++i) input[i] = value(me, i);
  co_await comm.all_gather(Buffer(input), Buffer(output));
  const std::string where = "all_gather i64";
  for (std::size_t q = 0; q < P; ++q) {
    for (std::size_t i = 0; i < kCount; ++i) m.check(output, q * kCount + i, value(q, i), where);
  }
}

// Rank r contributes r + j % 11 at position j; block r of the sum is what it gets.
awaitable<void> check_reduce_scatter(Communicator& comm, Mismatch& m) {
  constexpr std::size_t kBlock = 1000;
  const int P = comm.size();
  const auto me = static_cast<std::size_t>(comm.rank());
  std::vector<float> input(kBlock * static_cast<std::size_t>(P)), output(kBlock, -1.0F);
  for (std::size_t j = 0; j < input.size(); ++j) {
    input[j] = static_cast<float>(comm.rank() + static_cast<int>(j % 11));
  }
  co_await comm.reduce_scatter(Buffer(input), Buffer(output), ReduceOp::sum);
  const std::string where = "reduce_scatter sum f32";
  for (std::size_t i = 0; i < kBlock; ++i) {
    const int position = static_cast<int>((me * kBlock + i) % 11);
    m.check(output, i, static_cast<float>(P * (P - 1) / 2 + P * position), where);
  }
}

// Block j of rank r's input holds (r, j, i); block q of its output must hold (q, r, i).
awaitable<void> check_all_to_all(Communicator& comm, Mismatch& m) {
  constexpr std::size_t kBlock = 513;
  const auto P = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  auto value = [](std::size_t from, std::size_t to, std::size_t i) {
    return static_cast<std::int32_t>(from * 100'000 + to * 1000 + i);
  };
  std::vector<std::int32_t> input(kBlock * P), output(kBlock * P, -1);
  for (std::size_t j = 0; j < P; ++j) {
    for (std::size_t i = 0; i < kBlock; ++i) input[j * kBlock + i] = value(me, j, i);
  }
  co_await comm.all_to_all(Buffer(input), Buffer(output));
  const std::string where = "all_to_all i32";
  for (std::size_t q = 0; q < P; ++q) {
    for (std::size_t i = 0; i < kBlock; ++i) {
      m.check(output, q * kBlock + i, value(q, me, i), where);
    }
  }
}

awaitable<std::string> check(Communicator& comm) {
  Mismatch m;
  // By default 4 B and 4 KB run recursive doubling; 1.2 MB and 6 MB, shared memory. At
  // 6 MB the in-place call sees its input a second time: with single copy it moves it onto
  // huge pages first (huge_page_advice.hpp).
  for (std::size_t count :
       {std::size_t{1}, std::size_t{1000}, std::size_t{300000}, std::size_t{1500000}}) {
    co_await check_all_reduce_sum(comm, count, m);
  }
  for (std::size_t count : {std::size_t{1001}, std::size_t{100003}}) {
    co_await check_all_reduce_avg(comm, count, m);
  }
  co_await check_broadcast(comm, 0, m);
  co_await check_broadcast(comm, comm.size() - 1, m);
  co_await check_all_gather(comm, m);
  co_await check_reduce_scatter(comm, m);
  co_await check_all_to_all(comm, m);
  co_await comm.barrier();
  co_return m.what;
}

// In-place sum all-reduces of vectors of ones, about 6 MB each; which shared-memory path
// each took is in the trace (BRAID_TRACE): three of a 2 MiB-aligned 6 MiB vector (on huge
// pages from its second use, where the kernel has free huge pages then), one of a fresh
// vector, and three of a vector from malloc.
awaitable<std::string> reuse(Communicator& comm) {
  const auto world = static_cast<float>(comm.size());
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  constexpr std::size_t kAlignedCount = 3 * kHugePage / sizeof(float);
  std::unique_ptr<float, decltype(&std::free)> aligned(
      static_cast<float*>(std::aligned_alloc(kHugePage, kAlignedCount * sizeof(float))),
      &std::free);
  if (aligned == nullptr) co_return std::string("could not allocate 6 MiB on a 2 MiB boundary");
  const std::span<float> on_huge_pages(aligned.get(), kAlignedCount);
  std::fill(on_huge_pages.begin(), on_huge_pages.end(), 1.0F);
  for (int i = 0; i < 3; ++i) co_await comm.all_reduce(Buffer(on_huge_pages), ReduceOp::sum);
  std::vector<float> fresh(1'500'001, 1.0F);
  co_await comm.all_reduce(Buffer(fresh), ReduceOp::sum);
  std::vector<float> from_malloc(1'500'000, 1.0F);
  for (int i = 0; i < 3; ++i) co_await comm.all_reduce(Buffer(from_malloc), ReduceOp::sum);
  Mismatch m;
  const float thrice = world * world * world;
  for (std::size_t i = 0; i < on_huge_pages.size(); ++i) {
    m.check(on_huge_pages, i, thrice, "aligned");
  }
  for (std::size_t i = 0; i < fresh.size(); ++i) m.check(fresh, i, world, "fresh");
  for (std::size_t i = 0; i < from_malloc.size(); ++i) m.check(from_malloc, i, thrice, "malloc");
  co_return m.what;
}

// Returns normally only if no all_reduce failed. 4 MiB: shared memory, several chunks.
// The buffer dies with the coroutine: a failed collective must have ended every transfer
// into or out of it before the error reaches us.
// `collective`: all_reduce, or broadcast / all_gather (from rank 0, in place), or
// small_all_reduce (8 elements) / barrier: one flag wait through the inline slots, or
// shared_all_reduce: all_reduce on memory from allocate_shared, which ranks reach through
// their own mappings (no system call that could fail on a dead process).
awaitable<void> die(Communicator& comm, int doomed, std::string collective) {
  // Splits into equal blocks for the in-place all-gather: 1 MiB per rank.
  const std::size_t count = static_cast<std::size_t>(comm.size()) << 18;
  std::vector<float> private_data(count, 1.0F);
  std::shared_ptr<std::byte[]> shared;
  if (collective == "shared_all_reduce") {
    shared = co_await comm.allocate_shared(count * sizeof(float));
    std::fill_n(reinterpret_cast<float*>(shared.get()), count, 1.0F);
  }
  const Buffer data =
      shared ? Buffer(shared.get(), count, braid::DType::f32) : Buffer(private_data);
  auto once = [&]() -> awaitable<void> {
    if (collective == "broadcast") {
      co_await comm.broadcast(data, 0);
    } else if (collective == "all_gather") {
      co_await comm.all_gather(data);
    } else if (collective == "small_all_reduce") {
      co_await comm.all_reduce(data.slice(0, 8), ReduceOp::sum);
    } else if (collective == "barrier") {
      co_await comm.barrier();
    } else {
      co_await comm.all_reduce(data, ReduceOp::avg);
    }
  };
  co_await once();
  if (comm.rank() == doomed) std::raise(SIGKILL);
  for (int i = 0; i < 1000; ++i) co_await once();
}

// die_node and until_failure: all_reduce of 4 MiB until one fails. On node `doomed_node`
// (-1: none) the rank of local rank 0 kills its node's braid-run and itself after the
// first: under braid-run --emulate-nodes the node's init then ends with its braid-run,
// and the kernel kills every process of the node. Every other rank says "rank R looping"
// after its first all_reduce.
awaitable<void> until_failure(Communicator& comm, int node, int local_rank, int doomed_node) {
  std::vector<float> data(std::size_t{1} << 20, 1.0F);
  co_await comm.all_reduce(Buffer(data), ReduceOp::avg);
  if (node == doomed_node && local_rank == 0) {
    ::kill(::getppid(), SIGKILL);
    std::raise(SIGKILL);
  }
  std::cout << "rank " << comm.rank() << " looping" << std::endl;
  for (;;) co_await comm.all_reduce(Buffer(data), ReduceOp::avg);
}

// The bytes `interface` has transmitted, from /proc/net/dev (this process's network
// namespace); -1 when it has no such interface.
long long transmitted(const std::string& interface) {
  std::ifstream dev("/proc/net/dev");
  for (std::string line; std::getline(dev, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != interface) continue;
    std::istringstream fields(line.substr(colon + 1));
    long long value = 0;
    for (int i = 0; i < 9; ++i) fields >> value;  // receive's 8 columns, then transmit bytes
    return value;
  }
  return -1;
}

struct LinkUse {
  long long sent = 0;
  double seconds = 0;  // the all_reduce on this rank
};

awaitable<LinkUse> link_use(Communicator& comm, std::size_t bytes, std::string interface) {
  std::vector<float> data(bytes / sizeof(float), 1.0F);
  co_await comm.barrier();
  const long long before = transmitted(interface);
  const auto start = std::chrono::steady_clock::now();
  co_await comm.all_reduce(Buffer(data), ReduceOp::sum);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  co_await comm.barrier();
  co_return LinkUse{.sent = transmitted(interface) - before, .seconds = took.count()};
}

int usage() {
  std::cerr << "usage: collective_probe check | reuse | die RANK "
               "[all_reduce|broadcast|all_gather|small_all_reduce|barrier|shared_all_reduce] "
               "| link BYTES IFACE | die_node NODE | until_failure\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "check" && mode != "reuse" && !(mode == "die" && argc > 2) &&
      !(mode == "link" && argc > 3) && !(mode == "die_node" && argc > 2) &&
      mode != "until_failure") {
    return usage();
  }
  const int doomed = mode == "die" || mode == "die_node" ? std::stoi(argv[2]) : -1;
  if (mode == "die" || mode == "die_node" || mode == "until_failure") {
    std::signal(SIGTERM, SIG_IGN);
  }
  try {
    braid::Runtime runtime;
    braid::transport::World::Options options;
    options.leave_timeout = 2s;  // a dead peer never leaves; don't wait long for it
    const braid::transport::LaunchInfo launch = braid::transport::parse_launch_env();
    auto world = braid::transport::World::join(runtime, launch, options);
    auto comm = Communicator::world(*world);
    const int rank = comm->rank();
    if (mode == "check" || mode == "reuse") {
      const std::string mismatch =
          runtime.spawn(mode == "check" ? check(*comm) : reuse(*comm)).get();
      if (!mismatch.empty()) {
        std::cerr << "rank " << rank << ": " << mismatch << "\n";
        return 1;
      }
      std::cout << "rank " << rank << " ok (all_reduce of 1 MiB: "
                << to_string(comm->algorithm_for(braid::collectives::CollectiveKind::all_reduce,
                                                 std::size_t{1} << 20))
                << ")\n";
      return 0;
    }
    if (mode == "link") {
      const std::size_t bytes = std::stoull(argv[2]);
      const LinkUse use = runtime.spawn(link_use(*comm, bytes, argv[3])).get();
      std::cout << fmt::format(
          "rank {} node {}: {} sent {} bytes during an all_reduce of {} "
          "bytes in {:.4f} s\n",
          rank, launch.node_rank, argv[3], use.sent, bytes, use.seconds);
      return 0;
    }
    try {
      if (mode == "die") {
        runtime.spawn(die(*comm, doomed, argc > 3 ? argv[3] : "all_reduce")).get();
      } else {
        runtime.spawn(until_failure(*comm, launch.node_rank, launch.local_rank, doomed)).get();
      }
    } catch (const braid::Error& e) {
      std::cerr << "rank " << rank << " saw: " << e.what() << "\n";
      return 3;
    }
    std::cerr << "rank " << rank << ": every all_reduce succeeded after rank " << doomed
              << " was killed\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
