// braid-trace: reads the per-rank traces a job wrote under BRAID_TRACE.
//
//   braid-trace merge DIR -o FILE        all ranks in one Chrome trace, clocks aligned
//   braid-trace summary DIR [--json]     compute, communication, overlap, exposed time
//                                        split into waiting for a late rank and transfer;
//                                        per-collective and per-bucket latencies
//   braid-trace html DIR -o FILE         a self-contained, zoomable timeline page
//
// DIR may also be a single trace file (a merged one, say). Bad input exits 1 with a
// message naming the file and the problem; a usage error exits 2.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <braid/trace/summary.hpp>

#include "html.hpp"
#include "trace_set.hpp"

namespace {

using braid::tools::trace_tool::TraceInputError;
using braid::tools::trace_tool::TraceSet;

constexpr const char* kUsage = R"(usage:
  braid-trace merge DIR -o FILE      all ranks' traces in one Chrome trace, clocks aligned
  braid-trace summary DIR [--json]   overlap, exposed communication (waiting for a late rank,
                                     transfer), collective latencies
  braid-trace html DIR -o FILE       a self-contained HTML timeline with the summary on top

DIR is the directory given to BRAID_TRACE (rank-<r>.trace.json files), or one trace file.
)";

struct Arguments {
  std::string command;
  std::string input;
  std::optional<std::string> output;
  bool json = false;
};

int usage_error(const std::string& message) {
  std::fprintf(stderr, "braid-trace: %s (braid-trace --help for usage)\n", message.c_str());
  return 2;
}

std::optional<Arguments> parse(int argc, char** argv, std::string& error) {
  Arguments args;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-o" || arg == "--output") {
      if (i + 1 == argc) {
        error = arg + " needs a file name";
        return std::nullopt;
      }
      args.output = argv[++i];
    } else if (arg == "--json") {
      args.json = true;
    } else if (arg == "-h" || arg == "--help") {
      args.command = "help";
      return args;
    } else if (!arg.empty() && arg[0] == '-') {
      error = "unknown option " + arg;
      return std::nullopt;
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 2) {
    error = positional.empty() ? "no command given" : "expected a command and one DIR";
    return std::nullopt;
  }
  args.command = positional[0];
  args.input = positional[1];
  return args;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw TraceInputError(fmt::format("{}: cannot write", path));
}

}  // namespace

int main(int argc, char** argv) {
  std::string error;
  const auto args = parse(argc, argv, error);
  if (!args) return usage_error(error);
  if (args->command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const bool needs_output = args->command == "merge" || args->command == "html";
  if (args->command != "merge" && args->command != "html" && args->command != "summary") {
    return usage_error("unknown command '" + args->command + "'");
  }
  if (needs_output && !args->output) return usage_error(args->command + " needs -o FILE");
  try {
    const TraceSet traces = TraceSet::load(args->input);
    if (args->command == "merge") {
      // Read as summary and html read it, so merge refuses what they would refuse.
      (void)traces.timeline();
      write_file(*args->output, traces.merged().dump() + "\n");
    } else {
      const braid::trace::Timeline timeline = traces.timeline();
      const braid::trace::Summary summary = braid::trace::summarize(timeline);
      if (args->command == "summary") {
        std::cout << (args->json ? braid::trace::format_json(summary)
                                 : braid::trace::format_text(summary));
      } else {
        write_file(*args->output,
                   braid::tools::trace_tool::render_html(
                       timeline, summary, fmt::format("braid timeline: {}", args->input)));
      }
    }
  } catch (const TraceInputError& e) {
    std::fprintf(stderr, "braid-trace: %s\n", e.what());
    return 1;
  } catch (const nlohmann::json::exception& e) {
    // A field of an unexpected type that the checks above did not name.
    std::fprintf(stderr, "braid-trace: %s: malformed trace: a field has the wrong type (%s)\n",
                 args->input.c_str(), braid::tools::trace_tool::json_error_text(e).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-trace: %s: %s\n", args->input.c_str(), e.what());
    return 1;
  }
  return 0;
}
