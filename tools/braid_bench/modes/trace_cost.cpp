// braid-bench trace-cost: what tracing costs. In process: ns per span with tracing off
// and on. Under braid-run: an all-reduce loop timed in ~2 ms batches that alternate
// tracing off and on (off, on, on, off: so drift in the machine's load hits both alike),
// reported as time per iteration, the median group's overhead in percent, and
// spans recorded per iteration; once as a trace records by default (small calls sampled)
// and once with every call recorded.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <braid/braid.hpp>

#include "../harness/report.hpp"
#include "../harness/results.hpp"
#include "../harness/subprocess.hpp"
#include "modes.hpp"

namespace braid::bench {
namespace {

using asio::awaitable;
using collectives::Communicator;
using Clock = std::chrono::steady_clock;

struct TraceCostOptions {
  int ranks = 2;
  std::vector<std::size_t> sizes{8, 64 << 10, 1 << 20};
  int rounds = 101;  // groups of four batches (off, on, on, off or on, off, off, on)
  int iters = 0;     // per batch; 0: about 2 ms of the loop
  bool worker = false;
};

OptionTable table(TraceCostOptions& o) {
  return {count("--ranks", o.ranks, 2, 4096), byte_sizes("--sizes", o.sizes),
          count("--rounds", o.rounds, 2, 1000000000).noted("groups of four batches"),
          count("--iters", o.iters, 1, 1000000000).noted("per batch; 0: about 2 ms"),
          flag("--worker", o.worker).unlisted()};
}

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

// The sampling a trace does with the knobs at their defaults (the table's, whatever this
// shell exports).
trace::SmallOpSampling default_sampling() {
  return trace::SmallOpSampling::from_environment(
      [](std::string_view) -> std::optional<std::string> { return std::nullopt; });
}

// ns per sampling decision of a small collective (sampling.hpp), what a call that is left
// out of the trace pays beyond the off cost: the median of batches, as above. A tight
// loop's throughput, so it leaves out the enabled() load and branch around it in run().
double ns_per_sampling_decision(const trace::SmallOpSampling& sampling, int batches) {
  constexpr int kCallsPerBatch = 1000000;
  std::vector<double> per_call;
  std::uint64_t recorded = 0;
  for (int batch = 0; batch < batches; ++batch) {
    const auto start = Clock::now();
    for (int i = 0; i < kCallsPerBatch; ++i) {
      recorded += sampling.weight(8, static_cast<std::uint64_t>(batch) * kCallsPerBatch + i, 1);
    }
    per_call.push_back(std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
                       kCallsPerBatch);
  }
  // Used, so the loop is not optimised away; about one call in every(), each weighing it.
  if (recorded == 0) std::cerr << "no call sampled\n";
  return median(per_call);
}

// One size: batches alternating off and on; prints one line (rank 0).
awaitable<void> measure_size(Communicator& comm, std::size_t bytes,
                             const TraceCostOptions& options) {
  std::vector<float> data(std::max<std::size_t>(bytes / sizeof(float), 1), 1.0f);
  const Buffer buffer(data);
  for (int i = 0; i < 5; ++i) co_await comm.all_reduce(buffer, ReduceOp::max);
  // The time per op: the fastest of batches of 20 over at least 5 ms (until rank 0 has
  // seen 5 ms). The first batches of a fresh process can take 100 us an op while a
  // partner is still starting up, which made batches of 20 iterations of an 8-byte op.
  const auto warm_start = Clock::now();
  double warm = 1.0;
  for (std::vector<double> seconds{0}; seconds[0] < 5e-3;) {
    const auto batch_start = Clock::now();
    for (int i = 0; i < 20; ++i) co_await comm.all_reduce(buffer, ReduceOp::max);
    warm = std::min(warm, std::chrono::duration<double>(Clock::now() - batch_start).count() / 20);
    seconds[0] = std::chrono::duration<double>(Clock::now() - warm_start).count();
    co_await comm.broadcast(Buffer(seconds), 0);
  }
  // Batches of about 2 ms, in fours: off, on, on, off, then on, off, off, on. The VM's
  // speed drifts over seconds and jumps between phases: rounds of 50 ms in pairs left
  // ±3% between the two halves of a pair, as much as the effect measured; batches this
  // short see the same phase in all four.
  std::vector<std::int64_t> iters{
      options.iters > 0 ? options.iters
                        : std::clamp<std::int64_t>(
                              static_cast<std::int64_t>(0.002 / std::max(warm, 1e-7)), 5, 20000)};
  co_await comm.broadcast(Buffer(iters), 0);
  const auto quads = static_cast<std::size_t>(options.rounds);
  std::vector<double> seconds(2 * quads, 0.0);  // [q]: off, [quads + q]: on
  std::size_t spans = 0;
  for (std::size_t quad = 0; quad < quads; ++quad) {
    for (int batch = 0; batch < 4; ++batch) {
      const bool tracing = ((batch == 1 || batch == 2) != (quad % 2 == 1));
      trace::set_enabled(tracing);
      const auto start = Clock::now();
      for (std::int64_t i = 0; i < iters[0]; ++i) co_await comm.all_reduce(buffer, ReduceOp::max);
      seconds[(tracing ? quads : 0) + quad] +=
          std::chrono::duration<double>(Clock::now() - start).count();
      trace::set_enabled(false);
      // Every batch starts after a clear (on or off alike, so none pays for the others'
      // records); the first two groups' records are counted, a copy later ones skip.
      if (tracing && quad < 2) spans += trace::snapshot().records.size();
      trace::clear();
    }
  }
  // The slowest rank's, batch by batch.
  co_await comm.all_reduce(Buffer(seconds), ReduceOp::max);
  if (comm.rank() == 0) {
    double off_total = 0;
    double on_total = 0;
    std::vector<double> overhead;  // per quad, percent
    for (std::size_t q = 0; q < quads; ++q) {
      off_total += seconds[q];
      on_total += seconds[quads + q];
      overhead.push_back(100.0 * (seconds[quads + q] - seconds[q]) / seconds[q]);
    }
    // The median group's and half the interquartile range: robust to the batch in which
    // the VM stalled for a millisecond, which moves a mean by percents.
    std::sort(overhead.begin(), overhead.end());
    const double quartile_spread =
        (overhead[overhead.size() * 3 / 4] - overhead[overhead.size() / 4]) / 2;
    const double loop_iters = 2.0 * static_cast<double>(quads * iters[0]);  // per setting
    std::cout << fmt::format(
                     "{{\"bytes\":{},\"iters\":{},\"off_us\":{:.4f},\"on_us\":{:.4f},"
                     "\"overhead_percent\":{:.3f},\"overhead_spread\":{:.3f},"
                     "\"spans_per_iter\":{:.4f}}}",
                     bytes, iters[0], off_total / loop_iters * 1e6, on_total / loop_iters * 1e6,
                     median(overhead), quartile_spread,
                     static_cast<double>(spans) / (4.0 * static_cast<double>(iters[0])))
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
  if (const auto value = json_number(line, key)) return *value;
  throw std::runtime_error("no " + key + " in " + line);
}

int run_driver(TraceCostOptions& options) {
  ns_per_span(true, 2);  // registers this thread and faults its first chunks in
  const double off_ns = ns_per_span(false, 50);
  const double on_ns = ns_per_span(true, 20);
  std::cout << fmt::format(
      "trace::Span in process (clock: {}): {:.2f} ns off, {:.2f} ns on (goal: 50 ns)\n",
      trace::clock_source() == trace::ClockSource::tsc ? "tsc" : "steady", off_ns, on_ns);
  const trace::SmallOpSampling defaults = default_sampling();
  const double decision_ns = ns_per_sampling_decision(defaults, 20);
  std::cout << fmt::format(
      "sampling decision for a collective below BRAID_TRACE_SAMPLE_KIB: {:.2f} ns; with a "
      "span one call in {}, a small call pays {:.2f} ns on average\n",
      decision_ns, defaults.every(), decision_ns + on_ns / defaults.every());
  // Twice: as a trace records by default (calls below BRAID_TRACE_SAMPLE_KIB sampled),
  // and with every call recorded, which is what a span per call costs. Both settings
  // explicitly, whatever this shell exports.
  const std::pair<std::string, std::string> settings[] = {
      {"default recording (small calls sampled, sampling.hpp)",
       fmt::format("BRAID_TRACE_SAMPLE_KIB={}", defaults.below_bytes() >> 10)},
      {"every call recorded (BRAID_TRACE_SAMPLE_KIB=0)", "BRAID_TRACE_SAMPLE_KIB=0"}};
  const Report report(
      false,
      {"bytes", "iters", "off us/iter", "on us/iter", "overhead", "spans/iter", "ns/span(loop)"},
      {10, 7, 12, 12, 16, 11, 13});
  for (const auto& [label, setting] : settings) {
    std::vector<std::string> args = arguments(table(options), {"--rounds", "--sizes"});
    if (options.iters > 0) args.insert(args.end(), {"--iters", std::to_string(options.iters)});
    std::vector<std::string> argv{"/usr/bin/env", "-u", "BRAID_TRACE_SAMPLE_EVERY", setting};
    for (auto& a : bench_worker(options.ranks, "trace-cost", args)) argv.push_back(a);
    const CommandResult result = run_command(argv, std::chrono::seconds(600));
    if (result.exit_code != 0) {
      std::cerr << "braid-bench trace-cost: braid-run exited with " << result.exit_code << ":\n"
                << result.output;
      return 1;
    }
    report.say(fmt::format(
        "\nall_reduce loop on {} ranks, {}; {} groups of four ~2 ms batches, tracing off and "
        "on in turn (slowest rank); overhead: the median group's, ± half its interquartile "
        "range:\n",
        options.ranks, label, options.rounds));
    report.heading();
    std::stringstream lines(result.output);
    for (std::string line; std::getline(lines, line);) {
      const auto brace = line.find('{');
      if (brace == std::string::npos) continue;
      line = line.substr(brace);
      const double off_us = number_after(line, "off_us");
      const double overhead = number_after(line, "overhead_percent");
      const double spans = number_after(line, "spans_per_iter");
      report.say(report.line(
          {std::to_string(static_cast<std::size_t>(number_after(line, "bytes"))),
           std::to_string(static_cast<int>(number_after(line, "iters"))), fixed(off_us, 2),
           fixed(number_after(line, "on_us"), 2),
           fmt::format("{:>7.2f}% ± {:>4.2f}%", overhead, number_after(line, "overhead_spread")),
           fixed(spans, 3), fixed(spans > 0 ? overhead / 100 * off_us * 1e3 / spans : 0.0, 1)}));
    }
  }
  return 0;
}

int run(TraceCostOptions& options) {
  return options.worker ? run_worker(options) : run_driver(options);
}

}  // namespace

Mode trace_cost_mode() {
  return describe<TraceCostOptions>(
      {.name = "trace-cost",
       .about = "ns per trace span off and on, the small-call sampling decision, and an "
                "all-reduce loop's time with tracing off and on in ~2 ms batches, with the default "
                "sampling and with every call recorded",
       .options = table,
       .run = run});
}

}  // namespace braid::bench
