// braid-bench p2p: point-to-point latency and bandwidth between two processes, beside
// ucx_perftest measured in the same run.
//
// How it measures, so the two sides compare like with like:
// - latency: rank 0 sends 8 bytes, rank 1 sends them back; one-way latency is half of
//   each round trip, reported as the median ("typical", ucx_perftest's 50%ile) and the
//   mean. ucx_perftest -t tag_lat does the same ping-pong with busy polling.
// - bandwidth: rank 0 keeps `window` 4 MiB sends in flight (a new one starts as each
//   completes) while rank 1 keeps as many receives posted; the clock stops when rank 1
//   acknowledges the last message.
//   ucx_perftest -t tag_bw streams sends the same way; its default window is 32 sends in
//   flight, so it is run with -O <window> to compare like with like.
// Both run with the same UCX environment (UCX_TLS and friends pass through). They still
// pick different transports: braid's endpoints handle peer failure, which in UCX 1.13
// rules out posix/sysv (unless UCX_MM_ERROR_HANDLING=y) and cma, while ucx_perftest
// (without -e) uses shared memory and cma.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <braid/braid.hpp>

#include "../../braid_run/emulated_nodes.hpp"
#include "../harness/report.hpp"
#include "../harness/subprocess.hpp"
#include "modes.hpp"

namespace braid::bench {
namespace {

using asio::awaitable;

struct P2pOptions {
  int latency_iterations = 20000;
  int bandwidth_iterations = 400;
  int window = 8;
  std::size_t latency_bytes = 8;
  std::size_t bandwidth_bytes = 4 << 20;
  bool json = false;
  bool worker = false;    // internal: this process is one of the two measured ranks
  bool no_peers = false;  // without ucx_perftest
  // Both processes, braid's and ucx_perftest's, on two nodes emulated on this machine
  // (braid-run --emulate-nodes 2), each link shaped to link_rate where given.
  bool emulate_nodes = false;
  std::string link_rate;
  // A tenth of each loop again, untimed, before it.
  int latency_warmup() const { return std::max(1, latency_iterations / 10); }
  int bandwidth_warmup() const { return std::max(1, bandwidth_iterations / 10); }
};

OptionTable table(P2pOptions& o) {
  return {count("--latency-iters", o.latency_iterations, 1, 1000000000),
          count("--bandwidth-iters", o.bandwidth_iterations, 1, 1000000000),
          count("--window", o.window, 1, 1000000000),
          flag("--json", o.json),
          flag("--no-peers", o.no_peers),
          flag("--emulate-nodes", o.emulate_nodes)
              .noted("braid and ucx_perftest between 2 nodes emulated here (root)"),
          word("--link-rate", o.link_rate).noted("with --emulate-nodes: each link shaped to this"),
          flag("--worker", o.worker).unlisted()};
}

struct Figures {
  double latency_median_us = 0;
  double latency_mean_us = 0;
  double bandwidth_gbps = 0;  // 10^9 bytes per second
};

// ---------------------------------------------------------------- the measured ranks

awaitable<std::vector<double>> ping_pong(transport::World& world, Buffer message, int iterations,
                                         std::uint64_t first_tag) {
  std::vector<double> round_trips_us;
  round_trips_us.reserve(static_cast<std::size_t>(iterations));
  const int peer = 1 - world.rank();
  for (int i = 0; i < iterations; ++i) {
    const std::uint64_t tag = first_tag + static_cast<std::uint64_t>(i);
    if (world.rank() == 0) {
      // The trace clock (the time-stamp counter where it is invariant, ~20 ns a read here)
      // rather than steady_clock (~44 ns): ucx_perftest times its iterations with the
      // counter too, and two reads per round trip are part of what is measured.
      const std::int64_t start = trace::now_ns();
      co_await world.send(peer, message, tag);
      co_await world.recv(peer, message, tag);
      round_trips_us.push_back(static_cast<double>(trace::now_ns() - start) / 1e3);
    } else {
      co_await world.recv(peer, message, tag);
      co_await world.send(peer, message, tag);
    }
  }
  co_return round_trips_us;
}

// One of stream()'s lanes: sends (rank 0) or receives (rank 1) messages first,
// first + stride, ... through one slot, starting each as soon as the previous completes.
awaitable<void> stream_lane(transport::World& world, Buffer slot, int first, int stride,
                            int iterations, std::uint64_t first_tag) {
  const int peer = 1 - world.rank();
  for (int i = first; i < iterations; i += stride) {
    const std::uint64_t tag = first_tag + static_cast<std::uint64_t>(i);
    if (world.rank() == 0) {
      co_await world.send(peer, slot, tag);
    } else {
      co_await world.recv(peer, slot, tag);
    }
  }
}

// Streams `iterations` messages from rank 0 to rank 1 with `window` in flight at all
// times (a sliding window, as ucx_perftest -O keeps it, not batches that drain to zero);
// returns seconds on rank 0, from the first send to rank 1's acknowledgement of the last.
awaitable<double> stream(transport::World& world, std::vector<std::vector<std::uint8_t>>& slots,
                         int iterations, int window, std::uint64_t first_tag) {
  auto executor = co_await asio::this_coro::executor;
  const int peer = 1 - world.rank();
  const int lanes = std::min(window, iterations);
  const auto start = Clock::now();
  using Op = decltype(asio::co_spawn(executor, stream_lane(world, Buffer(slots[0]), 0, 1, 0, 0),
                                     asio::deferred));
  std::vector<Op> ops;
  for (int k = 0; k < lanes; ++k) {
    ops.push_back(asio::co_spawn(executor,
                                 stream_lane(world, Buffer(slots[static_cast<std::size_t>(k)]), k,
                                             lanes, iterations, first_tag),
                                 asio::deferred));
  }
  auto [order, errors] = co_await asio::experimental::make_parallel_group(std::move(ops))
                             .async_wait(asio::experimental::wait_for_all(), asio::use_awaitable);
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  std::uint8_t ack = 1;
  Buffer ack_buffer(&ack, 1, DType::u8);
  if (world.rank() == 0) {
    co_await world.recv(peer, ack_buffer, first_tag + static_cast<std::uint64_t>(iterations));
  } else {
    co_await world.send(peer, ack_buffer, first_tag + static_cast<std::uint64_t>(iterations));
  }
  co_return std::chrono::duration<double>(Clock::now() - start).count();
}

awaitable<Figures> measure(transport::World& world, const P2pOptions& options) {
  std::vector<std::uint8_t> small(options.latency_bytes, 7);
  Buffer small_buffer(small);
  co_await ping_pong(world, small_buffer, options.latency_warmup(), 0);
  auto round_trips = co_await ping_pong(world, small_buffer, options.latency_iterations, 1u << 24);

  std::vector<std::vector<std::uint8_t>> slots(
      static_cast<std::size_t>(options.window),
      std::vector<std::uint8_t>(options.bandwidth_bytes, 1));
  co_await stream(world, slots, options.bandwidth_warmup(), options.window, 2u << 24);
  const double seconds =
      co_await stream(world, slots, options.bandwidth_iterations, options.window, 3u << 24);

  Figures figures;
  if (world.rank() == 0) {
    std::sort(round_trips.begin(), round_trips.end());
    figures.latency_median_us = round_trips[round_trips.size() / 2] / 2;
    figures.latency_mean_us =
        std::accumulate(round_trips.begin(), round_trips.end(), 0.0) / round_trips.size() / 2;
    figures.bandwidth_gbps =
        static_cast<double>(options.bandwidth_bytes) * options.bandwidth_iterations / seconds / 1e9;
  }
  co_return figures;
}

constexpr std::string_view kResultMarker = "BRAID_P2P_RESULT";

int run_worker(const P2pOptions& options) {
  Runtime runtime;
  auto world = transport::World::join(runtime);
  if (world->size() != 2) {
    std::cerr << "braid-bench p2p: needs exactly 2 ranks, got " << world->size() << "\n";
    return 2;
  }
  const Figures figures = runtime.spawn(measure(*world, options)).get();
  if (world->rank() == 0) {
    std::cout << fmt::format("{} {} {} {}\n", kResultMarker, figures.latency_median_us,
                             figures.latency_mean_us, figures.bandwidth_gbps);
  }
  return 0;
}

// ---------------------------------------------------------------- the driver

// braid-run's flags that put one process on each of two emulated nodes.
std::vector<std::string> emulation(const P2pOptions& options) {
  std::vector<std::string> flags{"--emulate-nodes", "2"};
  if (!options.link_rate.empty()) flags.insert(flags.end(), {"--link-rate", options.link_rate});
  return flags;
}

std::optional<Figures> run_braid(P2pOptions& options) {
  auto argv = bench_worker(
      options.emulate_nodes ? 1 : 2, "p2p",
      arguments(table(options), {"--latency-iters", "--bandwidth-iters", "--window"}), 300);
  if (options.emulate_nodes) {
    const auto flags = emulation(options);
    argv.insert(argv.begin() + 1, flags.begin(), flags.end());
  }
  const auto result = run_command(argv, std::chrono::seconds(320));
  std::smatch match;
  const std::regex line(std::string(kResultMarker) +
                        R"( ([0-9.eE+-]+) ([0-9.eE+-]+) ([0-9.eE+-]+))");
  if (result.exit_code != 0 || !std::regex_search(result.output, match, line)) {
    std::cerr << "braid-bench p2p: the braid measurement failed (exit " << result.exit_code
              << "):\n"
              << result.output;
    return std::nullopt;
  }
  return Figures{std::stod(match[1]), std::stod(match[2]), std::stod(match[3])};
}

// The numbers of ucx_perftest's "Final:" row: iterations, then latency 50%ile, average,
// overall (us), bandwidth average, overall (MB/s), message rate average, overall.
std::optional<std::vector<double>> final_row_in(const std::string& output) {
  std::smatch match;
  const std::regex final_row(R"(Final:\s+([0-9.]+(?:\s+[0-9.]+){7}))");
  if (!std::regex_search(output, match, final_row)) return std::nullopt;
  std::istringstream numbers(match[1].str());
  std::vector<double> row;
  for (double x; numbers >> x;) row.push_back(x);
  return row;
}

// Across two emulated nodes: the server on node 0, the client on node 1 trying until the
// server listens, both under one braid-run.
std::optional<std::vector<double>> perftest_across_nodes(
    const P2pOptions& options, const std::vector<std::string>& test_args) {
  std::string client =
      fmt::format("ucx_perftest {} -p 29400", launcher::EmulatedNodes::address_of(0));
  for (const std::string& a : test_args) client += " " + a;
  const std::string script = fmt::format(
      "if [ \"$BRAID_NODE_RANK\" = 0 ]; then exec ucx_perftest -p 29400; fi; "
      "for i in $(seq 100); do {} && exit 0; sleep 0.1; done; exit 1",
      client);
  std::vector<std::string> argv{sibling_program("braid-run")};
  const auto flags = emulation(options);
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"-n", "1", "--no-prefix", "--timeout", "300", "/bin/sh", "-c", script});
  const auto result = run_command(argv, std::chrono::seconds(320));
  auto row = final_row_in(result.output);
  if (!row) {
    std::cerr << "braid-bench p2p: ucx_perftest " << test_args[1]
              << " across emulated nodes did not produce a result:\n"
              << result.output;
  }
  return row;
}

std::optional<std::vector<double>> perftest_final_row(const P2pOptions& options,
                                                      const std::vector<std::string>& test_args) {
  if (options.emulate_nodes) return perftest_across_nodes(options, test_args);
  const int port = transport::find_free_port();
  BackgroundProcess server({"ucx_perftest", "-p", std::to_string(port)});
  std::vector<std::string> client{"ucx_perftest", "127.0.0.1", "-p", std::to_string(port)};
  client.insert(client.end(), test_args.begin(), test_args.end());
  // The server needs a moment to listen; the client gives up at once when nobody does.
  for (int attempt = 0; attempt < 50; ++attempt) {
    const auto result = run_command(client, std::chrono::seconds(300));
    if (auto row = final_row_in(result.output); result.exit_code == 0 && row) {
      server.wait(std::chrono::seconds(10));
      return row;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::cerr << "braid-bench p2p: ucx_perftest " << test_args[1] << " did not produce a result\n";
  return std::nullopt;
}

std::optional<Figures> run_ucx_perftest(const P2pOptions& options) {
  auto latency =
      perftest_final_row(options, {"-t", "tag_lat", "-s", std::to_string(options.latency_bytes),
                                   "-n", std::to_string(options.latency_iterations), "-w",
                                   std::to_string(options.latency_warmup())});
  auto bandwidth = perftest_final_row(
      options, {"-t", "tag_bw", "-s", std::to_string(options.bandwidth_bytes), "-n",
                std::to_string(options.bandwidth_iterations), "-w",
                std::to_string(options.bandwidth_warmup()), "-O", std::to_string(options.window)});
  if (!latency || !bandwidth) return std::nullopt;
  // MB/s in ucx_perftest is 2^20 bytes per second.
  return Figures{(*latency)[1], (*latency)[2], (*bandwidth)[5] * (1 << 20) / 1e9};
}

int run_driver(P2pOptions& options) {
  const auto braid = run_braid(options);
  if (!braid) return 1;
  std::optional<Figures> peer;
  if (!options.no_peers && on_path("ucx_perftest")) peer = run_ucx_perftest(options);
  const char* tls = std::getenv("UCX_TLS");
  const Report report(options.json, {"metric", "size", "braid", "ucx_perftest", "braid/peer"},
                      {-24, 7, 12, 14, 12});
  report.say(fmt::format(
      "# braid-bench p2p: 2 processes {}, UCX_TLS={}\n",
      options.emulate_nodes
          ? "on 2 emulated nodes" +
                (options.link_rate.empty() ? std::string() : " linked at " + options.link_rate)
          : std::string("on this host"),
      tls != nullptr ? tls : "(default)"));
  report.heading();
  auto row = [&](std::string_view metric, std::string_view size, double Figures::*field,
                 bool higher_is_better) {
    const double mine = (*braid).*field;
    const std::optional<double> theirs = peer ? std::optional((*peer).*field) : std::nullopt;
    const std::optional<double> ratio = peer ? std::optional(mine / *theirs) : std::nullopt;
    const auto json = [](const std::optional<double>& x, const char* format) {
      return x ? fmt::format(fmt::runtime(format), *x) : std::string("null");
    };
    report.row(fmt::format(R"({{"bench":"p2p","metric":"{}","size":"{}","braid":{:.4f},)"
                           R"("ucx_perftest":{},"ratio":{},"better":"{}"}})",
                           metric, size, mine, json(theirs, "{:.4f}"), json(ratio, "{:.3f}"),
                           higher_is_better ? "higher" : "lower"),
               {std::string(metric), std::string(size), fixed(mine, 3), fixed(theirs, 3),
                fixed(ratio, 2, "x")});
  };
  row("latency median (us)", "8 B", &Figures::latency_median_us, false);
  row("latency mean (us)", "8 B", &Figures::latency_mean_us, false);
  row("bandwidth (GB/s)", "4 MiB", &Figures::bandwidth_gbps, true);
  return 0;
}

int run(P2pOptions& options) {
  if (!options.link_rate.empty() && !options.emulate_nodes) {
    throw std::invalid_argument("--link-rate needs --emulate-nodes");
  }
  return options.worker ? run_worker(options) : run_driver(options);
}

}  // namespace

Mode p2p_mode() {
  return describe<P2pOptions>(
      {.name = "p2p",
       .about = "8-byte latency and 4 MiB bandwidth between two processes, beside ucx_perftest",
       .options = table,
       .run = run});
}

}  // namespace braid::bench
