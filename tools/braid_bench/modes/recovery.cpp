// braid-bench recovery: what a failure costs a training job. A punisher SIGKILLs a random
// rank of the main jobs (ddp_train with Adam on 2 ranks, train_3d on tp 2 x pp 2) running
// under braid-run --max-restarts, `--interval` seconds after each recovery, `--kills`
// times a run. Per kill: detection (the kill to braid-run's verdict naming the rank), the
// kill to the first step after the restart (process start, libtorch, rendezvous, restore
// and that step), and the steps lost (the newest step rank 0 finished before the restart,
// less the step resumed after). Per run: goodput, the failure-free job's wall time over this
// one's. Two ways side by side, in the same run: braid's (an in-memory checkpoint every
// step, --memory-every 1) and the anchor's (a full restart from a disk checkpoint taken
// every 50 steps, as torchrun users do). And what in-memory checkpointing costs a step
// without failures. Goals: kill to next step <= 5 s, <= 1 step lost, <= 3% of a step.
//
// --nodes N runs the jobs on N emulated nodes (braid-run --emulate-nodes, root only), where
// every node's braid-run restarts its ranks; --kill node then kills a whole node other than
// node 0 (its init: every process of it, its memory with them), which braid-run starts
// again empty; its ranks get their in-memory copies back from their partners on the other
// node (MemoryCheckpoints' partner copies).

#include <algorithm>
#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../harness/report.hpp"
#include "../harness/results.hpp"
#include "../harness/subprocess.hpp"
#include "modes.hpp"

namespace braid::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct RecoveryOptions {
  std::vector<std::string> jobs{"ddp", "3d"};
  int nodes = 1;
  std::string kill = "rank";
  int kills = 10;
  double interval = 2.0;
  int anchor_every = 50;
  int seed = 1;
  int rounds = 3;
  bool json = false;
};

OptionTable table(RecoveryOptions& o) {
  return {
      words("--jobs", o.jobs, {"ddp", "3d"}),
      count("--nodes", o.nodes, 1, 2).noted("emulated nodes the jobs run on (root only)"),
      word("--kill", o.kill, {"rank", "node"})
          .noted("what the punisher kills: a random rank, or a whole node other than node 0"),
      count("--kills", o.kills, 1, 100),
      decimal("--interval", o.interval, 0.2, 600).noted("seconds from a recovery to the next kill"),
      count("--anchor-every", o.anchor_every, 1)
          .noted("the anchor's steps between disk checkpoints"),
      count("--seed", o.seed, 0).noted("which ranks are killed"),
      count("--rounds", o.rounds, 1, 20).noted("of the checkpoint cost's runs, taking turns"),
      flag("--json", o.json)};
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// The main jobs' programs: built beside braid-bench's directory, in examples/.
std::string example_program(const std::string& name) {
  return (fs::path(sibling_program(name)).parent_path().parent_path() / "examples" / name).string();
}

struct JobShape {
  std::string name;
  int ranks;
  std::vector<std::string> argv;  // the program and its arguments
};

JobShape shape_of(const std::string& job) {
  if (job == "ddp") {
    return {"ddp_train (Adam, 2 ranks)",
            2,
            {example_program("ddp_train"), "--optimizer", "adam", "--seed", "3"}};
  }
  return {"train_3d (tp 2 x pp 2)",
          4,
          {example_program("train_3d"), "--tp", "2", "--pp", "2", "--seed", "3"}};
}

// One line of --step-log: {"step": 12, "start": 0, "ns": 123}.
struct StepRecord {
  std::int64_t step, start, ns;
};

std::vector<StepRecord> read_step_log(const fs::path& path) {
  std::vector<StepRecord> records;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto step = json_number(line, "step");
    const auto start = json_number(line, "start");
    const auto ns = json_number(line, "ns");
    if (step && start && ns) {
      records.push_back({static_cast<std::int64_t>(*step), static_cast<std::int64_t>(*start),
                         static_cast<std::int64_t>(*ns)});
    }
  }
  return records;
}

// braid-run with the job, its output read line by line with the time each line arrived.
class WatchedJob {
 public:
  WatchedJob(const std::vector<std::string>& argv, int nodes) : nodes_(nodes) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    pid_ = spawn(argv, fds[1]);
    ::close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] {
      std::string pending;
      char chunk[4096];
      for (ssize_t n; (n = ::read(fd, chunk, sizeof chunk)) > 0;) {
        const std::int64_t at = now_ns();
        pending.append(chunk, static_cast<std::size_t>(n));
        std::lock_guard lock(mutex_);
        for (std::size_t end; (end = pending.find('\n')) != std::string::npos;) {
          lines_.push_back({at, pending.substr(0, end)});
          pending.erase(0, end + 1);
        }
      }
      ::close(fd);
    });
  }
  ~WatchedJob() {
    stop();
    if (reader_.joinable()) reader_.join();
  }

  // The job's ranks now: braid-run's children, or on emulated nodes those of each node's
  // braid-run (the child of the node's init).
  std::vector<int> ranks() const {
    if (nodes_ == 1) return children_of(pid_);
    std::vector<int> found;
    for (int init : children_of(pid_)) {
      for (int node_braid_run : children_of(init)) {
        for (int rank : children_of(node_braid_run)) found.push_back(rank);
      }
    }
    return found;
  }
  // The inits of the nodes other than node 0, which braid-run started first and never
  // replaces (a replaced node's init is younger, so node 0's keeps the lowest pid).
  std::vector<int> nodes_but_the_first() const {
    std::vector<int> inits = children_of(pid_);
    std::sort(inits.begin(), inits.end());
    if (!inits.empty()) inits.erase(inits.begin());
    return inits;
  }
  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      status_ = exit_status_of(status);
      return false;
    }
    return true;
  }
  // Waits for the end; its exit status (-1 after killing it at the deadline).
  int wait(std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (running() && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (running()) {
      stop();
      status_ = -1;
    }
    if (reader_.joinable()) reader_.join();
    return status_;
  }
  // The first line containing `text` that arrived at `after_ns` or later.
  std::optional<std::int64_t> first_line(const std::string& text, std::int64_t after_ns) {
    std::lock_guard lock(mutex_);
    for (const auto& [at, line] : lines_) {
      if (at >= after_ns && line.find(text) != std::string::npos) return at;
    }
    return std::nullopt;
  }
  std::string output() {
    std::lock_guard lock(mutex_);
    std::string all;
    for (const auto& [at, line] : lines_) all += line + "\n";
    return all;
  }

 private:
  // SIGTERM, which braid-run passes to its ranks (they would outlive a SIGKILLed braid-run
  // and hold the output pipe open), then SIGKILL after its grace.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (running() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  static std::vector<int> children_of(int pid) {
    std::vector<int> found;
    std::error_code ignored;
    for (const auto& task : fs::directory_iterator(fmt::format("/proc/{}/task", pid), ignored)) {
      std::ifstream children(task.path() / "children");
      for (int child; children >> child;) found.push_back(child);
    }
    return found;
  }

  int nodes_ = 1;
  int pid_ = -1;
  int status_ = -1;
  std::thread reader_;
  std::mutex mutex_;
  std::vector<std::pair<std::int64_t, std::string>> lines_;
};

struct Kill {
  double detect_ms = 0;   // the kill to braid-run's verdict
  double recover_s = 0;   // the kill to the first step after the restart
  std::int64_t lost = 0;  // steps finished before the kill and done again
};

struct RunResult {
  double wall_s = 0;
  double step_ms = 0;  // median step time, failure-free stretches
  std::vector<Kill> kills;
  bool ok = false;
};

// A scratch directory for a run's step log and checkpoints, removed after it.
struct Scratch {
  Scratch() : path(fs::temp_directory_path() / fmt::format("braid-bench-recovery-{}", ::getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Scratch() { fs::remove_all(path); }
  fs::path path;
};

// Runs the job for `steps` steps with `extra` arguments; with kills > 0, under
// --max-restarts, killing a random rank `interval` seconds after each start's first step.
struct Punisher {
  int nodes = 1;            // emulated nodes the job runs on (1: none)
  bool whole_node = false;  // kill a node other than node 0, not a rank
};

RunResult run_job(const JobShape& shape, int steps, const std::vector<std::string>& extra,
                  int kills, double interval, std::mt19937& random, const Punisher& punisher) {
  Scratch scratch;
  const fs::path log = scratch.path / "steps.jsonl";
  std::vector<std::string> argv{sibling_program("braid-run")};
  if (punisher.nodes > 1) {
    argv.insert(argv.end(), {"--emulate-nodes", std::to_string(punisher.nodes)});
  }
  argv.insert(argv.end(), {"-n", std::to_string(shape.ranks / punisher.nodes), "--max-restarts",
                           std::to_string(kills)});
  argv.insert(argv.end(), shape.argv.begin(), shape.argv.end());
  argv.insert(argv.end(), {"--steps", std::to_string(steps), "--step-log", log.string()});
  for (const auto& e : extra) {
    argv.push_back(e == "{dir}" ? (scratch.path / "checkpoints").string() : e);
  }
  RunResult result;
  const std::int64_t began = now_ns();
  WatchedJob job(argv, punisher.nodes);
  std::vector<std::int64_t> kill_ns;
  for (int k = 0; k < kills; ++k) {
    // This start's first step, then the interval.
    bool started = false;
    while (job.running() && !started) {
      for (const auto& r : read_step_log(log)) started = started || r.start == k;
      if (!started) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const auto kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(interval));
    while (job.running() && Clock::now() < kill_at) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const std::vector<int> victims = punisher.whole_node ? job.nodes_but_the_first() : job.ranks();
    if (!job.running() || victims.empty()) break;
    const int victim =
        victims[std::uniform_int_distribution<std::size_t>(0, victims.size() - 1)(random)];
    kill_ns.push_back(now_ns());
    ::kill(victim, SIGKILL);
  }
  const int status = job.wait(std::chrono::seconds(600));
  result.wall_s = static_cast<double>(now_ns() - began) / 1e9;
  const std::vector<StepRecord> records = read_step_log(log);
  if (status != 0 || records.empty() || records.back().step != steps) {
    std::cerr << job.output()
              << fmt::format("braid-bench recovery: {} {} ended with status {} after step {}\n",
                             shape.name, fmt::join(extra, " "), status,
                             records.empty() ? 0 : records.back().step);
    return result;
  }
  for (std::size_t k = 0; k < kill_ns.size(); ++k) {
    Kill kill;
    if (auto verdict = job.first_line("was killed by signal", kill_ns[k])) {
      kill.detect_ms = static_cast<double>(*verdict - kill_ns[k]) / 1e6;
    }
    std::int64_t finished = 0;
    std::optional<StepRecord> first_after;
    for (const auto& r : records) {
      if (r.start == static_cast<std::int64_t>(k)) finished = std::max(finished, r.step);
      if (r.start == static_cast<std::int64_t>(k) + 1 && !first_after) first_after = r;
    }
    if (!first_after) continue;
    kill.recover_s = static_cast<double>(first_after->ns - kill_ns[k]) / 1e9;
    kill.lost = finished - (first_after->step - 1);
    result.kills.push_back(kill);
  }
  // Step times within a start (not across a restart), from the second step of each.
  std::vector<double> gaps;
  for (std::size_t i = 2; i < records.size(); ++i) {
    if (records[i].start == records[i - 1].start && records[i - 1].start == records[i - 2].start) {
      gaps.push_back(static_cast<double>(records[i].ns - records[i - 1].ns) / 1e6);
    }
  }
  result.step_ms = gaps.empty() ? 0 : median(gaps);
  result.ok = true;
  return result;
}

std::string median_and_max(std::vector<double> values, int digits) {
  if (values.empty()) return "-";
  const double most = *std::max_element(values.begin(), values.end());
  return fmt::format("{:.{}f} / {:.{}f}", median(values), digits, most, digits);
}

int run(RecoveryOptions& o) {
  for (const std::string program : {"ddp_train", "train_3d"}) {
    if (!fs::exists(example_program(program))) {
      std::cerr << "braid-bench recovery: no " << example_program(program)
                << " (the main jobs are built with libtorch only)\n";
      return 1;
    }
  }
  if (o.kill == "node" && o.nodes < 2) {
    std::cerr << "braid-bench recovery: --kill node needs --nodes 2\n";
    return 2;
  }
  const Punisher punisher{.nodes = o.nodes, .whole_node = o.kill == "node"};
  const Punisher none{.nodes = o.nodes};
  const Report report(
      o.json,
      {"job", "way", "kills", "detect ms", "kill->step s", "lost steps", "goodput", "step ms"},
      {-26, -30, 6, 16, 14, 12, 8, 8});
  report.say(fmt::format(
      "recovery: {} SIGKILLed {:g} s after each start's first step, {} times a run, "
      "under braid-run{} --max-restarts {}; detect: the kill to braid-run's verdict; "
      "kill->step: to the first step after the restart (median / max); lost: steps finished "
      "before the kill and done again (median / max); goodput: the failure-free job's wall "
      "time over this run's.\n\n",
      punisher.whole_node ? "a random node other than node 0 (its init, every process of it)"
                          : "a random rank",
      o.interval, o.kills,
      o.nodes > 1 ? fmt::format(" --emulate-nodes {}", o.nodes) : std::string(), o.kills));
  report.heading();
  std::mt19937 random(static_cast<unsigned>(o.seed));
  int status = 0;
  for (const std::string& job : o.jobs) {
    const JobShape shape = shape_of(job);
    // How many steps span the kills: from a short failure-free run's step time.
    const RunResult probe = run_job(shape, 60, {}, 0, 0, random, none);
    if (!probe.ok || probe.step_ms <= 0) {
      status = 1;
      continue;
    }
    const int steps = static_cast<int>((o.kills + 1) * (o.interval + 0.5) * 1000 / probe.step_ms);
    const RunResult plain = run_job(shape, steps, {}, 0, 0, random, none);
    // What the copies cost a step: short runs without and with them, taking turns, the
    // median of each's step time (several ranks on two cores make single runs noisy).
    std::vector<double> without, with;
    for (int round = 0; round < o.rounds; ++round) {
      const RunResult a = run_job(shape, 300, {}, 0, 0, random, none);
      const RunResult b = run_job(shape, 300, {"--memory-every", "1"}, 0, 0, random, none);
      if (a.ok && b.ok) {
        without.push_back(a.step_ms);
        with.push_back(b.step_ms);
      }
    }
    const std::vector<std::pair<std::string, std::vector<std::string>>> ways{
        {"braid: in memory every step", {"--memory-every", "1"}},
        {fmt::format("anchor: disk every {}, restart", o.anchor_every),
         {"--checkpoint-dir", "{dir}", "--checkpoint-every", std::to_string(o.anchor_every)}}};
    for (const auto& [way, extra] : ways) {
      const RunResult failed = run_job(shape, steps, extra, o.kills, o.interval, random, punisher);
      if (!failed.ok || !plain.ok) {
        status = 1;
        continue;
      }
      std::vector<double> detect, recover, lost;
      for (const Kill& k : failed.kills) {
        detect.push_back(k.detect_ms);
        recover.push_back(k.recover_s);
        lost.push_back(static_cast<double>(k.lost));
      }
      const double goodput = plain.wall_s / failed.wall_s;
      JsonLine json;
      json.add("job", job)
          .add("way", way)
          .add("nodes", o.nodes)
          .add("kill", o.kill)
          .add("steps", steps)
          .add("kills", failed.kills.size());
      std::string per_kill = "[";
      for (const Kill& k : failed.kills) {
        per_kill += fmt::format("{}{{\"detect_ms\":{:.1f},\"recover_s\":{:.3f},\"lost\":{}}}",
                                per_kill.size() > 1 ? "," : "", k.detect_ms, k.recover_s, k.lost);
      }
      json.raw("per_kill", per_kill + "]")
          .add("wall_s", failed.wall_s, "{:.2f}")
          .add("failure_free_wall_s", plain.wall_s, "{:.2f}")
          .add("goodput", goodput, "{:.3f}");
      report.row(json.str(),
                 {shape.name, way, std::to_string(failed.kills.size()), median_and_max(detect, 0),
                  median_and_max(recover, 2), median_and_max(lost, 0), fixed(goodput, 2, "x"),
                  fixed(failed.step_ms, 2)});
    }
    if (!without.empty()) {
      const double plain_ms = median(without);
      const double memory_ms = median(with);
      const double cost = memory_ms / plain_ms - 1;
      JsonLine json;
      json.add("job", job)
          .add("plain_step_ms", plain_ms, "{:.3f}")
          .add("memory_step_ms", memory_ms, "{:.3f}")
          .add("memory_cost", cost, "{:.4f}");
      report.row(json.str(),
                 {"", fmt::format("in memory every step costs {:+.1f}% a step ({:.2f} ms over "
                                  "{:.2f} ms, medians of {} runs each; goal <= 3%)",
                                  100 * cost, memory_ms, plain_ms, without.size())});
    } else {
      status = 1;
    }
  }
  report.say(
      "\nOn 2 cores the ranks fill both, so the in-memory copy's memcpy takes its time from "
      "them; on a GPU it is a device-to-host copy beside the step.\n");
  return status;
}

}  // namespace

Mode recovery_mode() {
  return describe<RecoveryOptions>(
      {.name = "recovery",
       .about = "a random rank of the main jobs (or, --nodes 2 --kill node, a whole emulated "
                "node) SIGKILLed every --interval s under braid-run "
                "--max-restarts: detection, kill to next step, steps lost, goodput; braid's "
                "in-memory checkpoints beside the anchor's restart from disk every 50 steps, and "
                "what in-memory checkpoints cost a step",
       .options = table,
       .run = run});
}

}  // namespace braid::bench
