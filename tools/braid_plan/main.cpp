// braid-plan: a pipeline schedule planned before it runs. Builds a schedule (or loads
// PyTorch's CSV), lowers it if it holds compute alone, validates it, simulates it and
// prints the rank-by-time grid, each rank's busy time, bubble and peak activations, the
// step time and the textbook bubble beside the simulated one.
//
//   braid-plan --schedule 1f1b --ranks 4 --microbatches 8
//   braid-plan --csv schedule.csv --costs-from traces/ --trace plan.json
//
// Costs are unit (F 1, B 2, I 1, W 1) unless given (--costs) or measured (--costs-from, in
// microseconds). A usage error exits 2, a file or schedule that cannot be read or run
// exits 1, each with one line on stderr.
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/parallel/pipeline_schedule.hpp>
#include <braid/parallel/pipeline_simulator.hpp>

#include "../braid_bench/harness/byte_size.hpp"
#include "measured_costs.hpp"
#include "trace_set.hpp"

namespace {

namespace parallel = braid::parallel;

constexpr const char* kUsage = R"(usage:
  braid-plan --schedule gpipe|1f1b|interleaved|zb --ranks P --microbatches M
             [--virtual-stages V] [options]
  braid-plan --csv FILE [options]          a schedule in PyTorch's CSV instead

options:
  --costs F,B,I,W         compute durations (default 1,2,1,1)
  --costs-from TRACE      median F, B, I, W spans of a braid trace (file or BRAID_TRACE
                          directory), in microseconds
  --latency X             each transfer between ranks, in the costs' unit (default 0)
  --activation-bytes N    what a stage keeps per microbatch for backward (64M, say), for the
                          peak memory
  --write-csv FILE        the schedule (as built or loaded) in PyTorch's CSV
  --trace FILE            the simulated run as a Chrome trace
  --full-grid             also print the grid with the transfers
  --quiet                 no grid
)";

struct Arguments {
  std::optional<std::string> schedule;
  int ranks = 0;
  int microbatches = 0;
  int virtual_stages = 1;
  std::optional<std::string> csv;
  std::optional<std::string> write_csv;
  std::optional<std::vector<double>> costs;
  std::optional<std::string> costs_from;
  double latency = 0;
  std::uint64_t activation_bytes = 0;
  std::optional<std::string> trace;
  bool full_grid = false;
  bool quiet = false;
  bool help = false;
};

// A usage error: one line on stderr, exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A file or schedule that cannot be read or run: exit 1.
using braid::tools::trace_tool::TraceInputError;

template <class Number>
Number number(std::string_view option, std::string_view text) {
  Number value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw UsageError(fmt::format("{} takes a number, not '{}'", option, text));
  return value;
}

int count(std::string_view option, std::string_view text) {
  const int value = number<int>(option, text);
  if (value < 1) throw UsageError(fmt::format("{} must be at least 1, not {}", option, value));
  return value;
}

double duration(std::string_view option, std::string_view text) {
  const double value = number<double>(option, text);
  if (!(value >= 0) || value == std::numeric_limits<double>::infinity())
    throw UsageError(fmt::format("{} takes a duration >= 0, not '{}'", option, text));
  return value;
}

std::vector<double> cost_list(std::string_view text) {
  std::vector<double> out;
  for (std::size_t begin = 0;;) {
    const std::size_t comma = text.find(',', begin);
    out.push_back(duration("--costs", text.substr(begin, comma - begin)));
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  if (out.size() != 4)
    throw UsageError(fmt::format("--costs takes four durations F,B,I,W, not '{}'", text));
  return out;
}

Arguments parse(int argc, char** argv) {
  Arguments args;
  bool have_ranks = false, have_microbatches = false, have_virtual = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&]() -> std::string_view {
      if (i + 1 == argc) throw UsageError(fmt::format("{} needs a value", arg));
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      args.help = true;
      return args;
    } else if (arg == "--schedule") {
      args.schedule = value();
    } else if (arg == "--ranks") {
      args.ranks = count(arg, value());
      have_ranks = true;
    } else if (arg == "--microbatches") {
      args.microbatches = count(arg, value());
      have_microbatches = true;
    } else if (arg == "--virtual-stages") {
      args.virtual_stages = count(arg, value());
      have_virtual = true;
    } else if (arg == "--csv") {
      args.csv = value();
    } else if (arg == "--write-csv") {
      args.write_csv = value();
    } else if (arg == "--costs") {
      args.costs = cost_list(value());
    } else if (arg == "--costs-from") {
      args.costs_from = value();
    } else if (arg == "--latency") {
      args.latency = duration(arg, value());
    } else if (arg == "--activation-bytes") {
      const std::string text(value());
      try {
        args.activation_bytes = braid::bench::parse_bytes(text);
      } catch (const std::invalid_argument& e) {
        throw UsageError(fmt::format("--activation-bytes: {}", e.what()));
      }
    } else if (arg == "--trace") {
      args.trace = value();
    } else if (arg == "--full-grid") {
      args.full_grid = true;
    } else if (arg == "--quiet") {
      args.quiet = true;
    } else {
      throw UsageError(fmt::format("unknown argument '{}'", arg));
    }
  }
  if (args.csv && (args.schedule || have_ranks || have_microbatches || have_virtual))
    throw UsageError("--csv takes the schedule from the file: no --schedule, --ranks, ...");
  if (!args.csv && !(args.schedule && have_ranks && have_microbatches))
    throw UsageError("give --schedule, --ranks and --microbatches, or --csv FILE");
  if (args.costs && args.costs_from)
    throw UsageError("--costs and --costs-from exclude each other");
  return args;
}

// A schedule CSV: PyTorch writes a few KiB; this holds every schedule the limits allow.
constexpr std::uintmax_t kMaxCsvBytes = std::uintmax_t{256} << 20;

std::string read_file(const std::string& path) {
  return braid::tools::trace_tool::read_bounded(path, kMaxCsvBytes);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw TraceInputError(fmt::format("{}: cannot write", path));
}

// A schedule error's first line, which names the offending action: the grid printed
// after it would take stderr's one line many.
std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

std::string bytes_text(std::uint64_t bytes) {
  if (bytes >= (std::uint64_t{1} << 30)) return fmt::format("{:.1f} GiB", bytes / 1073741824.0);
  if (bytes >= (std::uint64_t{1} << 20)) return fmt::format("{:.1f} MiB", bytes / 1048576.0);
  if (bytes >= (std::uint64_t{1} << 10)) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{} B", bytes);
}

// The schedule the arguments name, built (a generator's refusal is a usage error) or read.
parallel::Schedule schedule_of(const Arguments& args) {
  if (args.csv) {
    try {
      return parallel::from_csv(read_file(*args.csv), *args.csv);
    } catch (const braid::Error& e) {
      throw TraceInputError(fmt::format("{}: {}", *args.csv, first_line(e.detail())));
    }
  }
  try {
    return parallel::make_schedule(*args.schedule, args.ranks, args.microbatches,
                                   args.virtual_stages);
  } catch (const braid::Error& e) {
    throw UsageError(first_line(e.detail()));
  }
}

parallel::SimulationCosts costs_of(const Arguments& args, std::string& unit) {
  parallel::SimulationCosts costs;
  unit = "";
  if (args.costs) {
    const auto& c = *args.costs;
    costs.forward = c[0];
    costs.backward = c[1];
    costs.backward_input = c[2];
    costs.backward_weight = c[3];
  } else if (args.costs_from) {
    const auto measured = braid::tools::plan::measured_costs(*args.costs_from);
    costs = measured.costs;
    unit = " us";
    fmt::print(
        "costs from {}: median F {:.1f} us ({} spans), B {:.1f} us ({}), I {:.1f} us "
        "({}), W {:.1f} us ({})\n",
        *args.costs_from, costs.forward, measured.spans[0], costs.backward, measured.spans[1],
        costs.backward_input, measured.spans[2], costs.backward_weight, measured.spans[3]);
  }
  costs.p2p_latency = args.latency;
  costs.activation_bytes = args.activation_bytes;
  return costs;
}

int plan(const Arguments& args) {
  const parallel::Schedule built = schedule_of(args);
  if (args.write_csv) write_file(*args.write_csv, parallel::to_csv(built));
  const std::string source = args.csv ? *args.csv : built.name;
  parallel::Schedule lowered;
  try {
    lowered = built.lowered() ? built : parallel::lower(built);
    parallel::validate(lowered);
  } catch (const braid::Error& e) {
    throw TraceInputError(fmt::format("{}: {}", source, first_line(e.detail())));
  }
  std::string unit;
  const parallel::SimulationCosts costs = costs_of(args, unit);
  const parallel::SimulationResult result = parallel::simulate(lowered, costs);

  const int ranks = lowered.ranks;
  const auto count = [](int n, std::string_view one, std::string_view many) {
    return fmt::format("{} {}", n, n == 1 ? one : many);
  };
  fmt::print("{}: {}, {}, {}; costs F {} B {} I {} W {}, latency {}{}\n", lowered.name,
             count(ranks, "rank", "ranks"), count(lowered.stages, "stage", "stages"),
             count(lowered.microbatches, "microbatch", "microbatches"), costs.forward,
             costs.backward, costs.backward_input, costs.backward_weight, costs.p2p_latency, unit);
  if (!args.quiet) {
    fmt::print("\n{}\n", parallel::grid_text(lowered, {}, /*compute_only=*/true));
    if (args.full_grid) fmt::print("with transfers:\n{}\n", parallel::grid_text(lowered));
  }
  fmt::print("{:>4}  {:>12}  {:>8}  {:>15}{}\n", "rank", "busy", "bubble", "peak in flight",
             args.activation_bytes > 0 ? "  peak activations" : "");
  for (int r = 0; r < ranks; ++r) {
    const auto index = static_cast<std::size_t>(r);
    fmt::print("{:>4}  {:>12.6g}  {:>7.2f}%  {:>15}", r, result.busy[index],
               result.bubble_percent[index], result.peak_in_flight[index]);
    if (args.activation_bytes > 0)
      fmt::print("  {:>17}", bytes_text(result.peak_activation_bytes[index]));
    fmt::print("\n");
  }
  fmt::print("step time {:.6g}{}\n", result.step_time, unit);
  const parallel::TextbookBubble textbook = parallel::textbook_bubble(lowered);
  fmt::print("bubble: simulated {:.2f}% (mean over ranks), textbook {:.2f}% ({})\n",
             result.mean_bubble_percent(), textbook.percent, textbook.formula);
  if (args.trace) {
    write_file(*args.trace, parallel::chrome_trace_json(lowered, result));
    fmt::print("trace: {}\n", *args.trace);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Arguments args = parse(argc, argv);
    if (args.help) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    return plan(args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "braid-plan: %s (braid-plan --help for usage)\n", e.what());
    return 2;
  } catch (const TraceInputError& e) {
    std::fprintf(stderr, "braid-plan: %s\n", e.what());
    return 1;
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "braid-plan: malformed trace: a field has the wrong type (%s)\n",
                 braid::tools::trace_tool::json_error_text(e).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-plan: %s\n", first_line(e.what()).c_str());
    return 1;
  }
}
