#include "trace_cost.hpp"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include <braid/braid.hpp>

#include "median.hpp"
#include "subprocess.hpp"

namespace braid::bench {
namespace {

using asio::awaitable;
using collectives::Communicator;
using Clock = std::chrono::steady_clock;

struct TraceCostOptions {
  int ranks = 2;
  std::vector<std::size_t> sizes{8, 64 << 10, 1 << 20};
  int rounds = 11;  // pairs of rounds (off and on); odd: the median is a measured pair
  int iters = 0;    // per round; 0: about 50 ms of the loop
  bool worker = false;
};

// ns per trace::Span: batches of spans recorded back to back, records cleared after each
// batch so memory stays bounded (cleared chunks are reused, so no batch pays page faults).
// The median batch: another process taking the core for a moment moves one batch only.
double ns_per_span(bool on, int batches) {
  constexpr int kSpansPerBatch = 100000;
  trace::set_enabled(on);
  std::vector<double> per_span;
  for (int batch = 0; batch < batches; ++batch) {
    trace::clear();
    const auto start = Clock::now();
    for (int i = 0; i < kSpansPerBatch; ++i) {
      trace::Span span(trace::Category::comm, "all_reduce", {}, static_cast<std::uint64_t>(i));
    }
    per_span.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                       kSpansPerBatch);
  }
  trace::set_enabled(false);
  trace::clear();
  return median(per_span);
}

awaitable<double> slowest(Communicator& comm, double seconds) {
  std::vector<double> value{seconds};
  co_await comm.all_reduce(Buffer(value), ReduceOp::max);
  co_return value[0];
}

// One size: rounds alternating off and on; prints one line (rank 0).
awaitable<void> measure_size(Communicator& comm, std::size_t bytes,
                             const TraceCostOptions& options) {
  std::vector<float> data(std::max<std::size_t>(bytes / sizeof(float), 1), 1.0f);
  const Buffer buffer(data);
  for (int i = 0; i < 5; ++i) co_await comm.all_reduce(buffer, ReduceOp::max);
  // The time per op over at least 5 ms of them (batches of 20 until rank 0 has seen 5 ms):
  // five ops alone, one of them held up for tens of microseconds, made an 8-byte round a
  // tenth of a millisecond.
  const auto warm_start = Clock::now();
  int warm_ops = 0;
  for (std::vector<double> seconds{0}; seconds[0] < 5e-3;) {
    for (int i = 0; i < 20; ++i) co_await comm.all_reduce(buffer, ReduceOp::max);
    warm_ops += 20;
    seconds[0] = std::chrono::duration<double>(Clock::now() - warm_start).count();
    co_await comm.broadcast(Buffer(seconds), 0);
  }
  const double warm = std::chrono::duration<double>(Clock::now() - warm_start).count() / warm_ops;
  std::vector<std::int64_t> iters{
      options.iters > 0 ? options.iters
                        : std::clamp<std::int64_t>(
                              static_cast<std::int64_t>(0.05 / std::max(warm, 1e-7)), 10, 20000)};
  co_await comm.broadcast(Buffer(iters), 0);
  std::vector<double> off;
  std::vector<double> on;
  std::vector<double> overhead;  // per pair of rounds, percent
  std::size_t spans = 0;
  // Rounds in pairs, off then on and on then off in turn: the VM's speed drifts over
  // seconds, and each pair's own ratio cancels the drift that medians of all off rounds
  // and all on rounds keep (their difference moved by ±1.5% between runs here).
  for (int pair = 0; pair < options.rounds; ++pair) {
    double pair_us[2] = {0, 0};  // off, on
    for (int half = 0; half < 2; ++half) {
      const bool tracing = (half == 1) != (pair % 2 == 1);
      trace::clear();
      trace::set_enabled(tracing);
      co_await comm.barrier();
      const auto start = Clock::now();
      for (std::int64_t i = 0; i < iters[0]; ++i) co_await comm.all_reduce(buffer, ReduceOp::max);
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      trace::set_enabled(false);
      if (tracing) spans = trace::snapshot().records.size();
      const double per_iter = co_await slowest(comm, elapsed) / static_cast<double>(iters[0]);
      pair_us[tracing ? 1 : 0] = per_iter * 1e6;
    }
    off.push_back(pair_us[0]);
    on.push_back(pair_us[1]);
    overhead.push_back(100.0 * (pair_us[1] - pair_us[0]) / pair_us[0]);
  }
  trace::clear();
  if (comm.rank() == 0) {
    const double off_us = median(off);
    const double on_us = median(on);
    // The barrier before the loop is traced too; it is a handful of spans per round.
    const double spans_per_iter = static_cast<double>(spans) / static_cast<double>(iters[0]);
    std::sort(overhead.begin(), overhead.end());
    const double quartile_spread =
        (overhead[overhead.size() * 3 / 4] - overhead[overhead.size() / 4]) / 2;
    std::cout << fmt::format(
                     "{{\"bytes\":{},\"iters\":{},\"off_us\":{:.3f},\"on_us\":{:.3f},"
                     "\"overhead_percent\":{:.3f},\"overhead_spread\":{:.3f},"
                     "\"spans_per_iter\":{:.4f}}}",
                     bytes, iters[0], off_us, on_us, median(overhead), quartile_spread,
                     spans_per_iter)
              << std::endl;
  }
}

awaitable<void> measure_all(Communicator& comm, const TraceCostOptions& options) {
  for (const std::size_t bytes : options.sizes) co_await measure_size(comm, bytes, options);
}

int run_worker(const TraceCostOptions& options) {
  Runtime runtime;
  auto world = transport::World::join(runtime);
  auto comm = Communicator::world(*world);
  runtime.spawn(measure_all(*comm, options)).get();
  return 0;
}

double number_after(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\":");
  if (at == std::string::npos) throw std::runtime_error("no " + key + " in " + line);
  return std::stod(line.substr(at + key.size() + 3));
}

int run_driver(const TraceCostOptions& options) {
  ns_per_span(true, 2);  // registers this thread and faults its first chunks in
  const double off_ns = ns_per_span(false, 50);
  const double on_ns = ns_per_span(true, 20);
  std::cout << fmt::format(
      "trace::Span in process (clock: {}): {:.2f} ns off, {:.2f} ns on (goal: 50 ns)\n",
      trace::clock_source() == trace::ClockSource::tsc ? "tsc" : "steady", off_ns, on_ns);
  // Twice: as a trace records by default (calls below BRAID_TRACE_SAMPLE_KIB sampled),
  // and with every call recorded, which is what a span per call costs.
  const std::pair<const char*, const char*> settings[] = {
      {"default recording (small calls sampled, sampling.hpp)", nullptr},
      {"every call recorded (BRAID_TRACE_SAMPLE_KIB=0)", "BRAID_TRACE_SAMPLE_KIB=0"}};
  for (const auto& [label, setting] : settings) {
    std::vector<std::string> argv;
    if (setting != nullptr) argv = {"/usr/bin/env", setting};
    argv.insert(argv.end(), {sibling_program("braid-run"), "-n", std::to_string(options.ranks),
                             sibling_program("braid-bench"), "trace-cost", "--worker", "--rounds",
                             std::to_string(options.rounds)});
    std::string sizes;
    for (const std::size_t s : options.sizes) {
      sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
    }
    argv.insert(argv.end(), {"--sizes", sizes});
    if (options.iters > 0) argv.insert(argv.end(), {"--iters", std::to_string(options.iters)});
    const CommandResult result = run_command(argv, std::chrono::seconds(600));
    if (result.exit_code != 0) {
      std::cerr << "braid-bench trace-cost: braid-run exited with " << result.exit_code << ":\n"
                << result.output;
      return 1;
    }
    std::cout << fmt::format(
        "\nall_reduce loop on {} ranks, {}; {} pairs of rounds with tracing off and on "
        "(slowest rank); overhead: the median pair's, ± half its interquartile range:\n",
        options.ranks, label, options.rounds);
    std::cout << fmt::format("{:>10} {:>7} {:>12} {:>12} {:>16} {:>11} {:>13}\n", "bytes", "iters",
                             "off us/iter", "on us/iter", "overhead", "spans/iter",
                             "ns/span(loop)");
    std::stringstream lines(result.output);
    for (std::string line; std::getline(lines, line);) {
      const auto brace = line.find('{');
      if (brace == std::string::npos) continue;
      line = line.substr(brace);
      const double off_us = number_after(line, "off_us");
      const double on_us = number_after(line, "on_us");
      const double spans = number_after(line, "spans_per_iter");
      const double overhead = number_after(line, "overhead_percent");
      std::cout << fmt::format(
          "{:>10} {:>7} {:>12.2f} {:>12.2f} {:>7.2f}% ± {:>4.2f}% {:>11.3f} {:>13.1f}\n",
          static_cast<std::size_t>(number_after(line, "bytes")),
          static_cast<int>(number_after(line, "iters")), off_us, on_us, overhead,
          number_after(line, "overhead_spread"), spans,
          spans > 0 ? overhead / 100 * off_us * 1e3 / spans : 0.0);
    }
  }
  return 0;
}

std::vector<std::size_t> parse_sizes(const std::string& text) {
  std::vector<std::size_t> sizes;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    std::size_t used = 0;
    const unsigned long long value = std::stoull(item, &used);
    if (used != item.size() || value == 0) throw std::invalid_argument("bad size '" + item + "'");
    sizes.push_back(value);
  }
  if (sizes.empty()) throw std::invalid_argument("--sizes needs at least one size");
  return sizes;
}

}  // namespace

int run_trace_cost(const std::vector<std::string>& args) {
  TraceCostOptions options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw std::invalid_argument(args[i] + " needs a value");
      return args[++i];
    };
    if (args[i] == "--worker") {
      options.worker = true;
    } else if (args[i] == "--ranks") {
      options.ranks = std::stoi(value());
    } else if (args[i] == "--sizes") {
      options.sizes = parse_sizes(value());
    } else if (args[i] == "--rounds") {
      options.rounds = std::stoi(value()) | 1;
    } else if (args[i] == "--iters") {
      options.iters = std::stoi(value());
    } else {
      throw std::invalid_argument("unknown option " + args[i]);
    }
  }
  if (options.ranks < 1) throw std::invalid_argument("--ranks must be at least 1");
  return options.worker ? run_worker(options) : run_driver(options);
}

}  // namespace braid::bench
