#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sched.h>

#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/deadline.hpp>
#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>

namespace braid::config {
namespace {

// THE table. Add a knob here before reading it anywhere.
constexpr std::array kKnobs{
    Knob{"BRAID_LOG_LEVEL", "warn", "log level: trace, debug, info, warn, error, critical, off"},
    Knob{"BRAID_TIMEOUT", "300",
         "seconds any single wait (receive, collective, store get) may take before it fails"},
    Knob{"BRAID_RANK", "", "this process's rank; set by braid-run"},
    Knob{"BRAID_WORLD_SIZE", "", "number of ranks in the job; set by braid-run"},
    Knob{"BRAID_LOCAL_RANK", "", "rank among the processes on this node; set by braid-run"},
    Knob{"BRAID_LOCAL_WORLD_SIZE", "", "number of ranks on this node; set by braid-run"},
    Knob{"BRAID_NODE_RANK", "", "index of this node in the job; set by braid-run"},
    Knob{"BRAID_NNODES", "", "number of nodes in the job; set by braid-run"},
    Knob{"BRAID_STORE", "",
         "the rendezvous store: host:port of braid's own, or etcd://host:port[,host:port...]/name "
         "for an etcd cluster (any member may answer; name: the job's namespace there)"},
    Knob{"BRAID_ETCD_TTL", "10",
         "seconds an etcd store client's lease lasts unrenewed: a process that dies has its "
         "will carried out this long after; one whose thread stalls this long is taken for "
         "dead (etcd raises values below its minimum, about 2)"},
    Knob{"BRAID_STORE_SERVED_BY", "rank0",
         "who serves the store at BRAID_STORE: rank0 (rank 0, for the job's life) or launcher "
         "(braid-run, so it outlives every rank); set by braid-run"},
    Knob{"BRAID_STORE_PREFIX", "",
         "the namespace of the ranks' keys in the store (braid-run gives each generation of a "
         "restarting job its own: braid/run/g/<n>/); set by braid-run"},
    Knob{"BRAID_TOKEN", "", "shared secret a store client must present; empty: no check"},
    Knob{"BRAID_RESTART_COUNT", "0",
         "how many times braid-run --max-restarts has restarted the job (0: its first start); "
         "set by braid-run"},
    Knob{"BRAID_SNAPSHOT_FDS", "",
         "the memfds braid-run keeps for this rank's in-memory checkpoints across its "
         "restarts (MemoryCheckpoints), as fd numbers: 7,8 (its own copies), or 7,8,9,10 "
         "across nodes (and its partner's); set by braid-run"},
    Knob{"BRAID_FAULT", "",
         "tests only: <point>:<n>:<rank> has rank <rank> SIGKILL itself the n-th time it "
         "passes <point> (forward, bucket-reduction, pipeline-send, memory-copy, disk-write), "
         "in the job's first start only (braid/core/fault_points.hpp); empty: never"},
    Knob{"BRAID_NETWORK_TIMEOUT", "10",
         "seconds a store connection may go unanswered (a node lost, a link cut) before "
         "its other end is declared failed; 0: TCP's own, about 15 minutes"},
    Knob{"BRAID_RUNTIME_CPUS", "",
         "CPUs the runtime thread (all of braid's communication work) may run on, as taskset "
         "writes them (3, 0-3, 0,2): keeps it off the cores the training threads use; empty: "
         "wherever the process may run"},
    Knob{"BRAID_UCX_SPIN_US", "50",
         "microseconds to keep polling UCX after the last activity before sleeping on its "
         "event fd (lower: less CPU, higher: lower latency)"},
    Knob{"BRAID_ALGO", "",
         "collective algorithm overrides, e.g. allreduce:0-64k:recursive_doubling#64k-inf:ring;"
         "broadcast:0-inf:binomial_tree (see docs/algorithms.md); empty: the built-in table"},
    Knob{"BRAID_RING_PIECE_KIB", "256",
         "size of the pieces ring collectives and the hierarchical all-reduce's chunks "
         "pipeline (KiB): smaller overlaps more, larger pays less per-message overhead"},
    Knob{"BRAID_SHM_SINGLE_COPY", "auto",
         "within a node, collectives read peers' buffers directly (cross-memory attach, "
         "process_vm_readv) instead of copying through a shared segment, where every rank's "
         "kernel allows it. auto: the others always; all-reduce from 64 KiB whichever of the "
         "two ways rank 0 has timed faster lately for its size (below, through the segment); "
         "1: always; 0: never"},
    Knob{"BRAID_SHM_DOORBELL", "1",
         "within a node, a collective that has waited past its short spin for a peer sleeps "
         "until the peer rings it (an eventfd each rank takes from the other with "
         "pidfd_getfd, where the kernel allows it, as for cross-memory attach); 0: it naps "
         "in growing sleeps (10-200 us) and polls"},
    Knob{"BRAID_HUGE_PAGES", "1",
         "back buffers of 4 MiB and more that peers reach by cross-memory attach with "
         "transparent huge pages (madvise MADV_COLLAPSE, Linux 6.1) once a collective sees "
         "them a second time: peers then pin one 2 MiB page where they pinned 512; 0: never"},
    Knob{"BRAID_KEEP_HEAP", "1",
         "the Runtime sets glibc's allocator once per process so a training step's "
         "temporaries are reused, not page-faulted in every step: blocks under 32 MiB from "
         "the heap, up to 1 GiB kept free at its top (costs: the process stays at its step's "
         "peak memory); 0, or any MALLOC_*_ variable or glibc.malloc tunable set: glibc's "
         "defaults"},
    Knob{"BRAID_STAGING_CHUNK_KIB", "1024",
         "CUDA buffers moved over UCX go through pinned host memory in chunks this size "
         "(KiB), so copies to and from the GPU overlap the network"},
    Knob{"BRAID_DEBUG", "off",
         "off, or detail: ranks exchange a fingerprint (kind, count, dtype, op, root) before "
         "every collective and a desync fails on every rank, naming both sides"},
    Knob{"BRAID_TP", "1",
         "tensor-parallel degree of a RankGrid made without one: ranks that split each "
         "layer's tensors"},
    Knob{"BRAID_CP", "1",
         "context-parallel degree of a RankGrid made without one: ranks that split the "
         "sequence"},
    Knob{"BRAID_DP", "0",
         "data-parallel degree of a RankGrid made without one; 0: the world size divided by "
         "tp x cp x pp"},
    Knob{"BRAID_PP", "1",
         "pipeline-parallel degree of a RankGrid made without one: ranks holding consecutive "
         "stages of the model"},
    Knob{"BRAID_GRID_ORDER", "tp-cp-dp-pp",
         "how a RankGrid made without an order lays its axes over the ranks, fastest-varying "
         "first (tp neighbours in rank order, so on one node; pp outermost); must name every "
         "axis of degree above 1"},
    Knob{"BRAID_BALANCE_CALIBRATION", "5",
         "steps a dp::BatchBalancer measures before its first rebalance"},
    Knob{"BRAID_BALANCE_INTERVAL", "10", "steps between a dp::BatchBalancer's rebalances"},
    Knob{"BRAID_BALANCE_SMOOTHING", "0.3",
         "weight of the newest step in a dp::BatchBalancer's moving average of throughputs, "
         "in (0, 1]"},
    Knob{"BRAID_BALANCE_FLOOR", "0.1",
         "no rank's batch share below this x the equal share, in [0, 1] (dp::BatchBalancer)"},
    Knob{"BRAID_BALANCE_DEAD_BAND", "0.05",
         "a dp::BatchBalancer keeps its shares while no batch size would move by more than "
         "this x the equal share"},
    Knob{"BRAID_BALANCE_ANCHOR", "1",
         "micro-batches the slowest rank computes per window at first (dp::CadenceBalancer)"},
    Knob{"BRAID_BALANCE_MAX_ANCHOR", "8",
         "the most micro-batches per window a dp::CadenceBalancer raises the slowest rank's "
         "count to"},
    Knob{"BRAID_BALANCE_OVERHEAD_TARGET", "0.1",
         "the share of a window a dp::CadenceBalancer keeps the synchronisation under, in "
         "(0, 1)"},
    Knob{"BRAID_TRACE", "",
         "directory: record a timeline and write rank-<r>.trace.json there (Chrome trace "
         "format) when the World leaves, at exit and on trace::write(); empty: off"},
    Knob{"BRAID_TRACE_BUFFER_MB", "256",
         "the most memory (MiB) trace records may hold in a process; past it each thread "
         "overwrites its own oldest records, and the trace file says how many were lost"},
    Knob{"BRAID_TRACE_STEPS_KIB", "256",
         "collectives moving at least this many KiB also record their steps (ring phases, "
         "shared-memory chunks and reductions) as spans inside the op's; smaller ones record "
         "the op alone, where a second span would cost ~1% of its time; 0: every op"},
    Knob{"BRAID_TRACE_SAMPLE_KIB", "16",
         "collectives moving fewer than this many KiB are recorded one in "
         "BRAID_TRACE_SAMPLE_EVERY after a communicator's first BRAID_TRACE_SAMPLE_EVERY "
         "calls (the same calls on every rank), where a span for each "
         "would cost 1-8% of their time; the summary counts each recorded one that many "
         "times; 0: every collective recorded"},
    Knob{"BRAID_TRACE_SAMPLE_EVERY", "64",
         "one in this many collectives below BRAID_TRACE_SAMPLE_KIB is recorded; 1: all"},
    Knob{"BRAID_TRACE_CLOCK", "auto",
         "the clock trace timestamps read: tsc (the CPU's time-stamp counter, kept in step "
         "with steady_clock; about half its cost), steady (steady_clock), or auto: tsc where "
         "the counter is invariant (x86-64, constant_tsc and nonstop_tsc) and the kernel's "
         "clocksource is tsc"},
};

[[noreturn]] void bad_value(std::string_view what, std::string_view text, std::string_view want) {
  throw Error(Errc::invalid_environment, fmt::format("{}='{}' is not {}", what, text, want));
}

}  // namespace

std::string_view trim(std::string_view text) noexcept {
  constexpr std::string_view blanks = " \t\n\r";
  const std::size_t first = text.find_first_not_of(blanks);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(blanks) - first + 1);
}

std::span<const Knob> knobs() {
  return kKnobs;
}

const Knob& knob(std::string_view name) {
  auto it =
      std::find_if(kKnobs.begin(), kKnobs.end(), [&](const Knob& k) { return k.name == name; });
  BRAID_ENFORCE(it != kKnobs.end(), "{} is not declared in the knob table (src/core/config.cpp)",
                name);
  return *it;
}

EnvLookup process_env() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

std::optional<std::string> raw(std::string_view name, const EnvLookup& env) {
  knob(name);
  return env(name);
}

std::string string_value(std::string_view name, const EnvLookup& env) {
  const Knob& k = knob(name);
  auto value = env(name);
  if (value && !trim(*value).empty()) return std::string(trim(*value));
  return std::string(k.default_value);
}

std::int64_t parse_int(std::string_view text, std::string_view what) {
  auto t = trim(text);
  std::int64_t out = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size()) {
    bad_value(what, text, "an integer");
  }
  return out;
}

bool parse_bool(std::string_view text, std::string_view what) {
  auto t = trim(text);
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  bad_value(what, text, "a boolean (1/0, true/false, yes/no, on/off)");
}

std::chrono::nanoseconds parse_seconds(std::string_view text, std::string_view what) {
  auto t = trim(text);
  double seconds = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), seconds);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size() || !std::isfinite(seconds) ||
      seconds < 0 || seconds > 1e9) {
    bad_value(what, text, "a non-negative number of seconds");
  }
  return std::chrono::nanoseconds(static_cast<std::int64_t>(seconds * 1e9));
}

std::vector<int> parse_cpu_list(std::string_view text, std::string_view what) {
  constexpr std::string_view expected = "a CPU list such as 3, 0-3 or 0,2,4-7";
  std::vector<int> cpus;
  std::string_view rest = trim(text);
  if (rest.empty()) bad_value(what, text, expected);
  auto number = [&](std::string_view digits) {
    int value = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || value < 0 ||
        value >= CPU_SETSIZE) {
      bad_value(what, text, expected);
    }
    return value;
  };
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (comma != std::string_view::npos && trim(rest).empty()) bad_value(what, text, expected);
    const std::size_t dash = item.find('-');
    const int first = number(item.substr(0, dash));
    const int last = dash == std::string_view::npos ? first : number(item.substr(dash + 1));
    if (last < first) bad_value(what, text, expected);
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

double number_value(std::string_view name, const EnvLookup& env) {
  const std::string text = string_value(name, env);
  const std::string_view t = trim(text);
  double value = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), value);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size() || !std::isfinite(value)) {
    bad_value(name, text, "a number");
  }
  return value;
}

std::int64_t int_value(std::string_view name, const EnvLookup& env) {
  return parse_int(string_value(name, env), name);
}
std::size_t kib_value(std::string_view name, std::int64_t min_kib, std::int64_t max_kib,
                      const EnvLookup& env) {
  const std::int64_t kib = int_value(name, env);
  if (kib < min_kib || kib > max_kib) {
    throw Error(Errc::invalid_environment,
                fmt::format("{}={} is outside {}..{} KiB", name, kib, min_kib, max_kib));
  }
  return static_cast<std::size_t>(kib) << 10;
}
bool bool_value(std::string_view name, const EnvLookup& env) {
  return parse_bool(string_value(name, env), name);
}
std::chrono::nanoseconds seconds_value(std::string_view name, const EnvLookup& env) {
  return parse_seconds(string_value(name, env), name);
}

std::string describe(const EnvLookup& env) {
  std::size_t name_width = 0, value_width = 7;
  for (const Knob& k : kKnobs) {
    name_width = std::max(name_width, k.name.size());
    value_width = std::max(value_width, env(k.name).value_or("").size());
  }
  std::string out = fmt::format("{:<{}}  {:<{}}  {:<8}  {}\n", "variable", name_width, "value",
                                value_width, "default", "meaning");
  for (const Knob& k : kKnobs) {
    auto value = env(k.name);
    out +=
        fmt::format("{:<{}}  {:<{}}  {:<8}  {}\n", k.name, name_width, value ? *value : "(unset)",
                    value_width, k.default_value.empty() ? "-" : k.default_value, k.doc);
  }
  return out;
}

}  // namespace braid::config

namespace braid {
// Read once, at first use: every send and receive without an explicit deadline asks, and
// a getenv plus parse per message was a tenth of small-message latency.
Clock::duration default_timeout() {
  static const Clock::duration timeout = [] {
    const auto seconds = config::seconds_value("BRAID_TIMEOUT");
    // Zero would fail every wait at once, with a message about the wait, not the variable.
    if (seconds <= std::chrono::milliseconds(0)) {
      throw Error(Errc::invalid_environment,
                  fmt::format("BRAID_TIMEOUT='{}' must be a positive number of seconds: every "
                              "wait (receive, collective, store get) fails once it passes",
                              config::string_value("BRAID_TIMEOUT")));
    }
    return std::chrono::duration_cast<Clock::duration>(seconds);
  }();
  return timeout;
}
}  // namespace braid
