// braid-bench collectives: an nccl-tests-like table for every collective, braid beside
// OpenMPI (mpirun) and torch.distributed with Gloo, measured in the same run.
//
// How it measures, the same way for braid and both peers (peers/README.md), so rows
// compare like with like:
// - sizes double from --min-bytes to --max-bytes; `bytes` is the per-rank buffer as
//   nccl-tests counts it (all_gather, all_gather_v: the output; gather: the root's output;
//   scatter: the root's input; reduce_scatter, all_to_all, all_to_all_v: the input), f32
//   elements, rounded down to a multiple of the ranks where the op splits the buffer.
// - 3 warm-up calls, then max(`iters` / 10, 10) untimed ones; then `iters` timed calls back to back
//   (adaptive: ~0.2 s, 5 to 100 000, decided by rank 0 from the warm-up and broadcast).
//   time = the slowest rank's mean.
//   (A cap of 1000 timed a 1 µs call over 1 ms, where one preemption doubled the row.)
// - algbw = bytes / time; busbw = algbw x (all_reduce 2(P-1)/P; broadcast, reduce 1; the
//   others (P-1)/P), so rows compare across world sizes.
// - after timing, one more call on fresh inputs is checked element by element against the
//   exact expected result (inputs are small integers, exact in f32): `wrong` counts the
//   elements that differ, summed over ranks. Every measured size is checked.
// - with --rounds N, braid and the peers are each run N times, taking turns (braid,
//   OpenMPI, Gloo, braid, ...), and every row reports the median time of its N rounds:
//   on a shared or throttled machine, a slow spell then moves one round of each instead
//   of all of whichever ran during it. Each run starts once the CPUs have been 90% idle
//   for 200 ms (at most 10 s of waiting).
// braid runs under braid-run, OpenMPI under mpirun with shared memory only (vader, CMA),
// Gloo as the build's PyTorch's ProcessGroupGloo over loopback TCP. Across emulated nodes
// (--emulate-nodes) all three run on the nodes: braid and Gloo under braid-run
// --emulate-nodes, mpirun on node 0 under braid-run --on-first-node, starting its daemons
// on the others through the nodes' launch agent, vader within a node and TCP between.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unistd.h>

#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <braid/braid.hpp>
#include <braid/collectives/communicator.hpp>

#include "../../braid_run/emulated_nodes.hpp"
#include "../../braid_run/link_rate.hpp"
#include "../harness/report.hpp"
#include "../harness/results.hpp"
#include "../harness/rounds.hpp"
#include "../harness/subprocess.hpp"
#include "modes.hpp"

namespace braid::bench {
namespace {

using asio::awaitable;
using collectives::Communicator;

const std::vector<std::string> kAllOps = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast",    "reduce", "gather",
    "scatter",    "all_to_all", "all_gather_v",   "all_to_all_v", "barrier"};

struct CollectivesOptions {
  std::vector<int> ranks{2, 4};
  std::vector<std::string> ops = kAllOps;
  std::size_t min_bytes = 8;
  std::size_t max_bytes = 64u << 20;
  int iters = 0;  // 0: adaptive
  int rounds = 1;
  bool json = false;
  bool no_peers = false;
  bool worker = false;
  // braid's buffers in memory from Communicator::allocate_shared (the peers keep theirs):
  // what a user who allocates the buffers it reduces every step that way gets.
  bool shared_buffers = false;
  // Every runner on this many nodes emulated on this machine (braid-run --emulate-nodes),
  // each link shaped to link_rate where given.
  int emulate_nodes = 0;
  std::string link_rate;
};

OptionTable table(CollectivesOptions& o) {
  return {counts("--ranks", o.ranks, 1, 4096),
          words("--ops", o.ops, kAllOps),
          bytes("--min-bytes", o.min_bytes),
          bytes("--max-bytes", o.max_bytes),
          count("--iters", o.iters, 0, 1000000000).noted("0: about 0.2 s a size"),
          count("--rounds", o.rounds, 1, 1000)
              .noted("braid and peers take turns N times; rows report medians"),
          flag("--json", o.json),
          flag("--no-peers", o.no_peers),
          flag("--shared-buffers", o.shared_buffers)
              .noted("braid's buffers from Communicator::allocate_shared"),
          count("--emulate-nodes", o.emulate_nodes, 0, 4096)
              .noted("N > 0: braid and the peers across N nodes emulated here (root)"),
          word("--link-rate", o.link_rate)
              .noted("with --emulate-nodes: each link shaped to this (10gbit); prints link%"),
          flag("--worker", o.worker).unlisted()};
}

// ---------------------------------------------------------------- one row's figures

struct Row {
  std::string peer;
  std::string op;
  int ranks = 0;
  std::size_t bytes = 0;
  int iters = 0;
  double time_us = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  long long wrong = 0;
};

// The ops whose buffer is cut into one block per rank: sizes are rounded to a multiple of
// the ranks, and busbw counts the (P-1)/P of the bytes that cross between ranks.
bool splits_across_ranks(const std::string& op) {
  return op != "all_reduce" && op != "broadcast" && op != "reduce" && op != "barrier";
}

double bus_factor(const std::string& op, int ranks) {
  const double p = ranks;
  if (op == "all_reduce") return 2 * (p - 1) / p;
  if (splits_across_ranks(op)) return (p - 1) / p;
  return 1;
}

// The bytes through each node's link (each way) per byte of `bytes`, on `nodes` nodes of
// `ranks` in all: the bus factor over the nodes, and for all_to_all times the node's ranks,
// each of which sends its own (N-1)/N to other nodes (the rest cross as one node's share).
double link_factor(const std::string& op, int nodes, int ranks) {
  const double factor = bus_factor(op, nodes);
  return op.starts_with("all_to_all") ? factor * (ranks / nodes) : factor;
}

// algbw and busbw from the row's bytes and time (GB/s).
void set_bandwidths(Row& row) {
  row.algbw_gbps = row.time_us > 0 ? static_cast<double>(row.bytes) / row.time_us / 1e3 : 0;
  row.busbw_gbps = row.algbw_gbps * bus_factor(row.op, row.ranks);
}

std::string to_json(const Row& row) {
  return fmt::format(
      R"({{"peer":"{}","op":"{}","ranks":{},"bytes":{},"count":{},"dtype":"f32",)"
      R"("iters":{},"time_us":{:.3f},"algbw_gbps":{:.6g},"busbw_gbps":{:.6g},"wrong":{}}})",
      row.peer, row.op, row.ranks, row.bytes, row.bytes / sizeof(float), row.iters, row.time_us,
      row.algbw_gbps, row.busbw_gbps, row.wrong);
}

std::optional<Row> parse_row(const std::string& line) {
  const auto ranks = json_number(line, "ranks"), bytes = json_number(line, "bytes"),
             time = json_number(line, "time_us"), busbw = json_number(line, "busbw_gbps"),
             wrong = json_number(line, "wrong");
  Row row{json_text(line, "peer"), json_text(line, "op")};
  if (row.peer.empty() || row.op.empty() || !ranks || !bytes || !time || !busbw || !wrong)
    return std::nullopt;
  row.ranks = static_cast<int>(*ranks);
  row.bytes = static_cast<std::size_t>(*bytes);
  row.iters = static_cast<int>(json_number(line, "iters").value_or(0));
  row.time_us = *time;
  row.algbw_gbps = json_number(line, "algbw_gbps").value_or(0);
  row.busbw_gbps = *busbw;
  row.wrong = static_cast<long long>(*wrong);
  return row;
}

// ---------------------------------------------------------------- the measured ranks

float input_value(int rank, std::size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
}
float reduced_value(int ranks, std::size_t i) {
  return static_cast<float>(ranks * (ranks + 1) / 2 * static_cast<int>(i % 7 + 1));
}

// The variable-count ops cut `total` elements into P uneven parts (the peers cut them the
// same way, peers/README.md): part j weighs ((j + shift) % P) + 1 of P(P+1)/2, rounded
// down, the last part taking the remainder. all_gather_v: rank r contributes part r of
// the output (shift 0); all_to_all_v: rank s sends part d of its input to rank d (shift s).
std::vector<std::size_t> uneven_counts(std::size_t total, int ranks, int shift) {
  const std::size_t p = static_cast<std::size_t>(ranks);
  const std::size_t weights = p * (p + 1) / 2;
  std::vector<std::size_t> counts(p);
  std::size_t given = 0;
  for (std::size_t j = 0; j + 1 < p; ++j) {
    counts[j] = total * ((j + static_cast<std::size_t>(shift)) % p + 1) / weights;
    given += counts[j];
  }
  counts[p - 1] = total - given;
  return counts;
}

std::size_t sum_before(const std::vector<std::size_t>& counts, std::size_t j) {
  std::size_t sum = 0;
  for (std::size_t i = 0; i < j; ++i) sum += counts[i];
  return sum;
}

// One op at one size: its buffers, the call, and the check of its result.
class Case {
 public:
  Case(Communicator& comm, std::string op, std::size_t bytes)
      : comm_(comm), op_(std::move(op)), rank_(comm.rank()), ranks_(comm.size()) {
    count_ = bytes / sizeof(float);
    block_ = count_ / static_cast<std::size_t>(ranks_);
    if (op_ == "all_gather_v") {
      gather_counts_ = uneven_counts(count_, ranks_, 0);
    } else if (op_ == "all_to_all_v") {
      send_counts_ = uneven_counts(count_, ranks_, rank_);
      for (int source = 0; source < ranks_; ++source) {
        recv_counts_.push_back(
            uneven_counts(count_, ranks_, source)[static_cast<std::size_t>(rank_)]);
      }
    }
  }

  // The buffers: private, or one allocate_shared allocation of the largest size any rank
  // needs (every rank must ask for the same).
  awaitable<void> allocate(bool shared) {
    const std::size_t elements = send_elements() + recv_elements();
    if (shared) {
      std::vector<std::int64_t> largest{static_cast<std::int64_t>(elements)};
      co_await comm_.all_reduce(Buffer(largest), ReduceOp::max);
      storage_ =
          co_await comm_.allocate_shared(static_cast<std::size_t>(largest[0]) * sizeof(float));
    } else {
      storage_ = std::make_shared<std::byte[]>(std::max<std::size_t>(elements, 1) * sizeof(float));
    }
    auto* floats = reinterpret_cast<float*>(storage_.get());
    send_ = std::span<float>(floats, send_elements());
    recv_ = std::span<float>(floats + send_elements(), recv_elements());
  }

  // Dispatches on kind_, not on the name: a chain of string comparisons cost the later
  // ops up to ~50 ns per call, a tenth of a small all-reduce (the C peer switches on an
  // int).
  awaitable<void> call() {
    switch (kind_) {
      case Kind::all_reduce:
        return comm_.all_reduce(Buffer(send_), Buffer(recv_), ReduceOp::sum);
      case Kind::all_gather:
        return comm_.all_gather(Buffer(send_), Buffer(recv_));
      case Kind::reduce_scatter:
        return comm_.reduce_scatter(Buffer(send_), Buffer(recv_), ReduceOp::sum);
      case Kind::broadcast:
        return comm_.broadcast(Buffer(recv_), 0);
      case Kind::reduce:
        return comm_.reduce(Buffer(send_), Buffer(recv_), ReduceOp::sum, 0);
      case Kind::gather:
        return comm_.gather(Buffer(send_), Buffer(recv_), 0);
      case Kind::scatter:
        return comm_.scatter(Buffer(send_), Buffer(recv_), 0);
      case Kind::all_to_all:
        return comm_.all_to_all(Buffer(send_), Buffer(recv_));
      case Kind::all_gather_v:
        return comm_.all_gather_v(Buffer(send_), Buffer(recv_), gather_counts_);
      case Kind::all_to_all_v:
        return comm_.all_to_all_v(Buffer(send_), send_counts_, Buffer(recv_), recv_counts_);
      case Kind::barrier:
        return comm_.barrier();
    }
    throw std::logic_error("braid-bench: a collective kind without a call");
  }

  void fill_inputs() {
    for (std::size_t i = 0; i < send_.size(); ++i) send_[i] = input_value(rank_, i);
    if (op_ == "broadcast" && rank_ == 0) {
      for (std::size_t i = 0; i < recv_.size(); ++i) recv_[i] = input_value(0, i);
    } else {
      std::fill(recv_.begin(), recv_.end(), -1.0f);
    }
  }

  long long count_wrong() const {
    if (op_ == "barrier" || ((op_ == "reduce" || op_ == "gather") && rank_ != 0)) return 0;
    if (op_ == "all_gather_v" || op_ == "all_to_all_v") return count_wrong_variable();
    long long wrong = 0;
    for (std::size_t i = 0; i < recv_.size(); ++i) wrong += recv_[i] != expected(i) ? 1 : 0;
    return wrong;
  }

 private:
  // Part s of the output came from rank s: all_gather_v, its whole input; all_to_all_v,
  // the piece of its input it cut for this rank.
  long long count_wrong_variable() const {
    const auto rank = static_cast<std::size_t>(rank_);
    const std::vector<std::size_t>& parts = op_ == "all_gather_v" ? gather_counts_ : recv_counts_;
    long long wrong = 0;
    std::size_t at = 0;
    for (int source = 0; source < ranks_; ++source) {
      const std::size_t first =
          op_ == "all_gather_v" ? 0 : sum_before(uneven_counts(count_, ranks_, source), rank);
      for (std::size_t k = 0; k < parts[static_cast<std::size_t>(source)]; ++k, ++at) {
        wrong += recv_[at] != input_value(source, first + k) ? 1 : 0;
      }
    }
    return wrong;
  }

  // The root's buffer of gather and scatter is `count` elements; the others' is unused.
  std::size_t send_elements() const {
    if (op_ == "all_gather" || op_ == "gather") return block_;
    if (op_ == "all_gather_v") return gather_counts_[static_cast<std::size_t>(rank_)];
    if (op_ == "scatter") return rank_ == 0 ? count_ : 0;
    if (op_ == "broadcast" || op_ == "barrier") return 0;
    return count_;
  }
  std::size_t recv_elements() const {
    if (op_ == "reduce_scatter" || op_ == "scatter") return block_;
    if (op_ == "gather") return rank_ == 0 ? count_ : 0;
    if (op_ == "all_to_all_v") return sum_before(recv_counts_, recv_counts_.size());
    if (op_ == "barrier") return 0;
    return count_;
  }
  float expected(std::size_t i) const {
    const auto rank = static_cast<std::size_t>(rank_);
    if (op_ == "all_reduce" || op_ == "reduce") return reduced_value(ranks_, i);
    if (op_ == "all_gather" || op_ == "gather")
      return input_value(static_cast<int>(i / block_), i % block_);
    if (op_ == "reduce_scatter") return reduced_value(ranks_, rank * block_ + i);
    if (op_ == "broadcast") return input_value(0, i);
    if (op_ == "scatter") return input_value(0, rank * block_ + i);
    // all_to_all: block s came from rank s, which sent its elements [rank*block, ...) here.
    return input_value(static_cast<int>(i / block_), rank * block_ + i % block_);
  }

  // In kAllOps's order, which names them (the options accept only those names).
  enum class Kind {
    all_reduce,
    all_gather,
    reduce_scatter,
    broadcast,
    reduce,
    gather,
    scatter,
    all_to_all,
    all_gather_v,
    all_to_all_v,
    barrier
  };
  static Kind kind_of(const std::string& op) {
    const auto at = std::find(kAllOps.begin(), kAllOps.end(), op);
    if (at == kAllOps.end()) throw std::invalid_argument("unknown collective '" + op + "'");
    return static_cast<Kind>(at - kAllOps.begin());
  }

  Communicator& comm_;
  std::string op_;
  Kind kind_ = kind_of(op_);
  int rank_;
  int ranks_;
  std::size_t count_ = 0;
  std::size_t block_ = 0;
  std::vector<std::size_t> gather_counts_;  // all_gather_v
  std::vector<std::size_t> send_counts_;    // all_to_all_v
  std::vector<std::size_t> recv_counts_;
  std::shared_ptr<std::byte[]> storage_;  // send_ then recv_
  std::span<float> send_;
  std::span<float> recv_;
};

awaitable<double> slowest(Communicator& comm, double seconds) {
  std::vector<double> value{seconds};
  co_await comm.all_reduce(Buffer(value), ReduceOp::max);
  co_return value[0];
}

awaitable<Row> measure(Communicator& comm, const std::string& op, std::size_t bytes,
                       const CollectivesOptions& options) {
  Case c(comm, op, bytes);
  co_await c.allocate(options.shared_buffers);
  c.fill_inputs();
  using Clock = std::chrono::steady_clock;
  // 3 warm-up calls; the loop is sized from the last two, as the peers do: the first pays
  // for page faults and, on a communicator's first shared-memory call, mapping the arena.
  constexpr int kWarmup = 3;
  co_await c.call();
  auto start = Clock::now();
  for (int i = 1; i < kWarmup; ++i) co_await c.call();
  const double warm = std::chrono::duration<double>(Clock::now() - start).count() / (kWarmup - 1);
  std::vector<std::int64_t> iters{options.iters};
  if (options.iters <= 0) {
    iters[0] =
        std::clamp<std::int64_t>(static_cast<std::int64_t>(0.2 / std::max(warm, 1e-7)), 5, 100000);
  }
  co_await comm.broadcast(Buffer(iters), 0);
  // A tenth of the loop again, untimed (~20 ms), as the peers do: the first size of a run
  // starts right after process start-up or another library's run, and its 8-byte row
  // read 0.7-1.2 us where it reads 0.55 us once the processes have settled. At least 10:
  // an all-reduce from 64 KiB first times both its shared-memory ways, four calls each
  // (path_timings.hpp), as NCCL's tests warm up 5 calls.
  for (std::int64_t i = 0; i < std::max<std::int64_t>(iters[0] / 10, 10); ++i) co_await c.call();
  co_await comm.barrier();
  start = Clock::now();
  for (std::int64_t i = 0; i < iters[0]; ++i) co_await c.call();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  const double time = co_await slowest(comm, elapsed) / static_cast<double>(iters[0]);
  c.fill_inputs();
  co_await c.call();
  std::vector<std::int64_t> wrong{c.count_wrong()};
  co_await comm.all_reduce(Buffer(wrong), ReduceOp::sum);
  Row row{"braid", op, comm.size(), bytes, static_cast<int>(iters[0]), time * 1e6, 0, 0, wrong[0]};
  set_bandwidths(row);
  co_return row;
}

awaitable<void> measure_all(Communicator& comm, const CollectivesOptions& options) {
  for (const std::string& op : options.ops) {
    if (op == "barrier") {
      const Row row = co_await measure(comm, op, 0, options);
      if (comm.rank() == 0) std::cout << to_json(row) << std::endl;
      continue;
    }
    const std::size_t granule =
        sizeof(float) * (splits_across_ranks(op) ? static_cast<std::size_t>(comm.size()) : 1);
    for (std::size_t size = options.min_bytes; size <= options.max_bytes; size *= 2) {
      const std::size_t bytes = size / granule * granule;
      if (bytes == 0) continue;
      const Row row = co_await measure(comm, op, bytes, options);
      if (comm.rank() == 0) std::cout << to_json(row) << std::endl;
    }
  }
}

int run_worker(const CollectivesOptions& options) {
  Runtime runtime;
  auto world = transport::World::join(runtime);
  auto comm = Communicator::world(*world);
  runtime.spawn(measure_all(*comm, options)).get();
  return 0;
}

// ---------------------------------------------------------------- the driver

// What braid's ranks and both peers are given alike.
std::vector<std::string> common_arguments(CollectivesOptions& options) {
  std::vector<std::string> args =
      arguments(table(options), {"--ops", "--min-bytes", "--max-bytes"});
  if (options.iters > 0) args.insert(args.end(), {"--iters", std::to_string(options.iters)});
  return args;
}

std::vector<Row> rows_from(const CommandResult& result, const std::string& who) {
  std::vector<Row> rows;
  std::stringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    // braid-run prefixes rank output with "[0] "; the JSON starts at the brace.
    const std::size_t brace = line.find('{');
    if (brace == std::string::npos) continue;
    if (auto row = parse_row(line.substr(brace))) rows.push_back(*row);
  }
  if (result.exit_code != 0) {
    std::cerr << "braid-bench collectives: " << who << " exited with " << result.exit_code
              << "; its output:\n"
              << result.output << "\n";
  }
  return rows;
}

// The braid-run in `argv` onto the emulated nodes, if any.
void emulate(const CollectivesOptions& options, std::vector<std::string>& argv, int ranks) {
  on_emulated_nodes(argv, options.emulate_nodes, options.link_rate, ranks);
}

std::vector<Row> run_braid(CollectivesOptions& options, int ranks) {
  std::vector<std::string> args = common_arguments(options);
  if (options.shared_buffers) args.push_back("--shared-buffers");
  std::vector<std::string> argv = bench_worker(ranks, "collectives", args, 1200);
  emulate(options, argv, ranks);
  return rows_from(run_command(argv, std::chrono::seconds(1300)), "braid");
}

std::vector<Row> run_openmpi(CollectivesOptions& options, int ranks) {
  const std::string peer = sibling_program("braid-bench-mpi-peer");
  if (!on_path("mpirun") || access(peer.c_str(), X_OK) != 0) {
    std::cerr << "braid-bench collectives: no OpenMPI peer (mpirun or " << peer << " missing)\n";
    return {};
  }
  // One node: shared memory only (vader, CMA), every rank yielding when idle as braid's do.
  std::vector<std::string> argv = words_of(fmt::format(
      "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --allow-run-as-root "
      "--oversubscribe --bind-to none -np {} --mca pml ob1 --mca mpi_yield_when_idle 1",
      ranks));
  if (options.emulate_nodes == 0) {
    argv.insert(argv.end(), {"--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"});
  } else {
    // Across emulated nodes: mpirun on node 0 starts its daemons on the others through the
    // nodes' launch agent (braid-run --on-first-node sets OMPI_MCA_plm_rsh_agent), shared
    // memory within a node and TCP over the nodes' links between them.
    std::string hosts;
    for (int node = 0; node < options.emulate_nodes; ++node) {
      hosts +=
          fmt::format("{}{}:{}", node == 0 ? "" : ",", launcher::EmulatedNodes::address_of(node),
                      ranks / options.emulate_nodes);
    }
    argv.insert(argv.end(), {"--host", hosts, "--mca", "btl", "self,vader,tcp", "--mca",
                             "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
                             "--mca", "plm_rsh_no_tree_spawn", "1"});
    std::vector<std::string> launched{sibling_program("braid-run"),
                                      "--emulate-nodes",
                                      std::to_string(options.emulate_nodes),
                                      "--on-first-node",
                                      "--timeout",
                                      "1200"};
    if (!options.link_rate.empty())
      launched.insert(launched.end(), {"--link-rate", options.link_rate});
    argv.insert(argv.begin(), launched.begin(), launched.end());
  }
  argv.push_back(peer);
  for (auto& a : common_arguments(options)) argv.push_back(a);
  return rows_from(run_command(argv, std::chrono::seconds(1300)), "mpirun");
}

std::vector<Row> run_gloo(CollectivesOptions& options, int ranks) {
  std::optional<std::vector<std::string>> argv = python_peer("braid-bench-gloo-peer.py");
  if (!argv) {
    std::cerr << "braid-bench collectives: no Gloo peer (a python3 with torch, or "
              << sibling_program("braid-bench-gloo-peer.py") << ", missing)\n";
    return {};
  }
  argv->insert(argv->end(), {"--ranks", std::to_string(ranks)});
  for (auto& a : common_arguments(options)) argv->push_back(a);
  if (options.emulate_nodes > 0) {
    // One process per rank under braid-run (env:// from its variables), Gloo's sockets on
    // the nodes' links.
    std::vector<std::string> launched{
        sibling_program("braid-run"), "-n", std::to_string(ranks), "--timeout", "1700", "env",
        "GLOO_SOCKET_IFNAME=eth0"};
    emulate(options, launched, ranks);
    launched.insert(launched.end(), argv->begin(), argv->end());
    *argv = std::move(launched);
  }
  return rows_from(run_command(*argv, std::chrono::seconds(1800)), "gloo");
}

std::optional<Row> find(const std::vector<Row>& rows, const Row& like) {
  for (const Row& row : rows) {
    if (row.op == like.op && row.bytes == like.bytes && row.ranks == like.ranks) return row;
  }
  return std::nullopt;
}

// One runner's rows over its rounds: each row of the first round with the median time of
// that row in every round that has it, and the wrong elements of all of them.
std::vector<Row> median_of_rounds(const std::vector<std::vector<Row>>& rounds) {
  if (rounds.empty()) return {};
  std::vector<Row> medians;
  for (const Row& first : rounds.front()) {
    Row row = first;
    std::vector<double> times;
    row.wrong = 0;
    for (const auto& round : rounds) {
      if (const auto same = find(round, first)) {
        times.push_back(same->time_us);
        row.wrong += same->wrong;
      }
    }
    row.time_us = median(times);
    set_bandwidths(row);
    medians.push_back(row);
  }
  return medians;
}

std::string human_bytes(std::size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

// braid's speed-up over a peer: the peer's time over braid's (= busbw ratio).
std::optional<double> speedup(const Row& braid, const std::optional<Row>& peer) {
  if (!peer || braid.time_us <= 0) return std::nullopt;
  return peer->time_us / braid.time_us;
}

std::string peer_json(const std::optional<Row>& row) {
  if (!row) return "null";
  return fmt::format(R"({{"time_us":{:.3f},"busbw_gbps":{:.6g},"wrong":{}}})", row->time_us,
                     row->busbw_gbps, row->wrong);
}

int run_driver(CollectivesOptions& options) {
  long long wrong = 0;
  bool any = false;
  using Runner = std::vector<Row> (*)(CollectivesOptions&, int);
  std::vector<Runner> runners{run_braid};
  if (!options.no_peers) runners.insert(runners.end(), {run_openmpi, run_gloo});
  std::vector<std::string> headings{"size",  "|",       "braid us", "algbw", "busbw",
                                    "wrong", "|",       "ompi us",  "busbw", "x ompi",
                                    "|",     "gloo us", "busbw",    "x gloo"};
  std::vector<int> widths{9, 1, 10, 8, 8, 5, 1, 10, 8, 7, 1, 10, 8, 7};
  // Across shaped links: braid's bandwidth through each node's link as a share of its rate,
  // the node-level bus bandwidth (algbw x the op's bus factor over the nodes), which no
  // algorithm can take past 100%.
  std::optional<double> link_gbps;
  if (!options.link_rate.empty()) {
    link_gbps = launcher::LinkRate::parse(options.link_rate).bytes_per_second / 1e9;
    headings.insert(headings.end(), {"|", "link%"});
    widths.insert(widths.end(), {1, 6});
  }
  const Report report(options.json, headings, widths);
  for (int ranks : options.ranks) {
    auto rounds = run_rounds(options.rounds, runners,
                             [&](Runner runner) { return std::optional(runner(options, ranks)); });
    rounds.resize(3);
    const std::vector<Row> braid = median_of_rounds(rounds[0]);
    const std::vector<Row> openmpi = median_of_rounds(rounds[1]);
    const std::vector<Row> gloo = median_of_rounds(rounds[2]);
    std::string current_op;
    for (const Row& row : braid) {
      any = true;
      const auto mpi = find(openmpi, row);
      const auto torch = find(gloo, row);
      wrong += row.wrong + (mpi ? mpi->wrong : 0) + (torch ? torch->wrong : 0);
      if (row.op != current_op) {
        current_op = row.op;
        report.say(fmt::format(
            "\n# {} on {} ranks{} (f32, sum; busbw in GB/s; x = peer time / braid time){}{}\n",
            row.op, ranks,
            options.emulate_nodes > 0
                ? fmt::format(" on {} emulated nodes{}", options.emulate_nodes,
                              options.link_rate.empty() ? "" : " linked at " + options.link_rate)
                : "",
            options.shared_buffers ? "; braid's buffers from allocate_shared" : "",
            options.rounds > 1
                ? fmt::format("; median of {} rounds, braid and peers taking turns", options.rounds)
                : ""));
        report.heading();
      }
      const auto of = [](const std::optional<Row>& peer, double Row::*figure) {
        return peer ? std::optional((*peer).*figure) : std::nullopt;
      };
      const auto speedup_json = [&](const std::optional<Row>& peer) {
        const auto x = speedup(row, peer);
        return x ? fmt::format("{:.3f}", *x) : std::string("null");
      };
      std::optional<double> link_share;
      if (link_gbps) {
        link_share =
            100 * row.algbw_gbps * link_factor(row.op, options.emulate_nodes, ranks) / *link_gbps;
      }
      std::vector<std::string> cells{human_bytes(row.bytes),
                                     "|",
                                     fixed(row.time_us, 2),
                                     fixed(row.algbw_gbps, 3),
                                     fixed(row.busbw_gbps, 3),
                                     std::to_string(row.wrong),
                                     "|",
                                     fixed(of(mpi, &Row::time_us), 2),
                                     fixed(of(mpi, &Row::busbw_gbps), 3),
                                     fixed(speedup(row, mpi), 2, "x"),
                                     "|",
                                     fixed(of(torch, &Row::time_us), 2),
                                     fixed(of(torch, &Row::busbw_gbps), 3),
                                     fixed(speedup(row, torch), 2, "x")};
      if (link_gbps) cells.insert(cells.end(), {"|", fixed(link_share, 0, "%")});
      report.row(
          fmt::format(R"({{"bench":"collectives","op":"{}","ranks":{},"bytes":{},"rounds":{},)"
                      R"("braid":{},"openmpi":{},"gloo":{},"speedup_openmpi":{},)"
                      R"("speedup_gloo":{}{}}})",
                      row.op, row.ranks, row.bytes, options.rounds, peer_json(row), peer_json(mpi),
                      peer_json(torch), speedup_json(mpi), speedup_json(torch),
                      link_share ? fmt::format(R"(,"emulated_nodes":{},"link_share":{:.3f})",
                                               options.emulate_nodes, *link_share / 100)
                                 : ""),
          cells);
    }
  }
  if (!any) {
    std::cerr << "braid-bench collectives: braid produced no rows\n";
    return 1;
  }
  if (wrong != 0) {
    std::cerr << "braid-bench collectives: " << wrong << " wrong elements\n";
    return 1;
  }
  return 0;
}

int run(CollectivesOptions& options) {
  if (options.min_bytes > options.max_bytes) {
    throw std::invalid_argument("need 0 < --min-bytes <= --max-bytes");
  }
  if (!options.link_rate.empty() && options.emulate_nodes == 0) {
    throw std::invalid_argument("--link-rate needs --emulate-nodes");
  }
  if (!options.link_rate.empty()) launcher::LinkRate::parse(options.link_rate);  // checked now
  for (int ranks : options.ranks) {
    if (options.emulate_nodes > 0 && ranks % options.emulate_nodes != 0) {
      throw std::invalid_argument(fmt::format("--ranks {} does not split over --emulate-nodes {}",
                                              ranks, options.emulate_nodes));
    }
  }
  return options.worker ? run_worker(options) : run_driver(options);
}

}  // namespace

Mode collectives_mode() {
  return describe<CollectivesOptions>(
      {.name = "collectives",
       .about = "every collective from --min-bytes to --max-bytes on --ranks, beside OpenMPI and "
                "torch.distributed Gloo; every size checked for correctness",
       .options = table,
       .run = run});
}

}  // namespace braid::bench
