// The exporter writes what the Chrome trace format, Perfetto and HTA require: an object
// with traceEvents; every event a ph, pid, tid, name; spans with ts and dur; metadata
// naming the process and each track; distributedInfo and braid's clock block.
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/trace/chrome_trace.hpp>
#include <braid/trace/output.hpp>
#include <braid/trace/span.hpp>

namespace braid::trace {
namespace {

using nlohmann::json;

Record span(std::uint32_t track, std::int64_t begin, std::int64_t end, const char* name,
            Category category = Category::comm, RecordKind kind = RecordKind::span) {
  Record r;
  r.track = track;
  r.begin_ns = begin;
  r.end_ns = end;
  r.name = name;
  r.category = category;
  r.kind = kind;
  return r;
}

Snapshot two_tracks() {
  Snapshot snap;
  snap.tracks.push_back(TrackInfo{.id = 1, .name = "communicator 1"});
  snap.tracks.push_back(TrackInfo{.id = 2, .name = "main", .thread = true, .os_thread_id = 42});
  return snap;
}

json exported(const Snapshot& snap, TraceIdentity identity = {.rank = 3, .world_size = 4}) {
  return json::parse(chrome_trace_json(snap, identity));
}

std::vector<json> events_with(const json& trace, std::string_view phase) {
  std::vector<json> out;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == phase) out.push_back(e);
  }
  return out;
}

TEST(ChromeTrace, EveryEventHasTheFieldsTheFormatRequires) {
  Snapshot snap = two_tracks();
  snap.records.push_back(span(1, 1000, 5000, "all_reduce"));
  Record instant = span(2, 2000, 2000, "marker", Category::user, RecordKind::instant);
  snap.records.push_back(instant);
  Record counter = span(2, 3000, 3000, "in_flight", Category::comm, RecordKind::counter);
  counter.args[0] = Arg{"in_flight", 7};
  counter.arg_count = 1;
  snap.records.push_back(counter);
  const json trace = exported(snap);
  ASSERT_TRUE(trace["traceEvents"].is_array());
  for (const json& e : trace["traceEvents"]) {
    EXPECT_TRUE(e["ph"].is_string()) << e;
    EXPECT_EQ(e["pid"], 3) << "pid is the rank: " << e;
    EXPECT_TRUE(e["tid"].is_number_unsigned()) << e;
    EXPECT_TRUE(e["name"].is_string()) << e;
    if (e["ph"] != "M") {
      EXPECT_TRUE(e["ts"].is_number()) << e;
      EXPECT_TRUE(e["cat"].is_string()) << e;
    }
  }
  const auto complete = events_with(trace, "X");
  ASSERT_EQ(complete.size(), 1u);
  EXPECT_EQ(complete[0]["tid"], 1);
  EXPECT_DOUBLE_EQ(complete[0]["ts"].get<double>(), 0.0) << "times start at the earliest record";
  EXPECT_DOUBLE_EQ(complete[0]["dur"].get<double>(), 4.0) << "microseconds";
  ASSERT_EQ(events_with(trace, "i").size(), 1u);
  EXPECT_EQ(events_with(trace, "i")[0]["s"], "t");
  ASSERT_EQ(events_with(trace, "C").size(), 1u);
  EXPECT_EQ(events_with(trace, "C")[0]["args"]["in_flight"], 7);
}

TEST(ChromeTrace, NamesTheProcessAndEveryTrackAndSaysWhoWroteIt) {
  Snapshot snap = two_tracks();
  snap.overwritten = 12288;  // records lost to BRAID_TRACE_BUFFER_MB
  const json trace = exported(snap, {.rank = 3,
                                     .world_size = 4,
                                     .host = "node7",
                                     .clock = {.offset_ns = -250, .round_trip_ns = 900}});
  EXPECT_EQ(trace["distributedInfo"]["rank"], 3);
  EXPECT_EQ(trace["distributedInfo"]["world_size"], 4);
  EXPECT_EQ(trace["braid"]["format"], "braid-trace");
  EXPECT_EQ(trace["braid"]["host"], "node7");
  EXPECT_EQ(trace["braid"]["clock"]["offset_ns"], -250);
  EXPECT_EQ(trace["braid"]["clock"]["round_trip_ns"], 900);
  EXPECT_EQ(trace["braid"]["clock"]["reference_rank"], 0);
  EXPECT_TRUE(trace["braid"]["clock"]["origin_ns"].is_number_integer());
  EXPECT_EQ(trace["braid"]["overwritten_records"], 12288);
  std::map<std::string, std::set<std::string>> metadata;  // name -> values
  for (const json& e : events_with(trace, "M")) {
    const json& value = e["args"].begin().value();
    metadata[e["name"]].insert(value.is_string() ? value.get<std::string>() : value.dump());
  }
  EXPECT_EQ(metadata["process_name"], std::set<std::string>{"rank 3 (node7)"});
  EXPECT_EQ(metadata["thread_name"], (std::set<std::string>{"communicator 1", "main (thread 42)"}));
  EXPECT_EQ(metadata["thread_sort_index"].size(), 2u);
}

TEST(ChromeTrace, NestedSpansAreCompleteEventsAndOverlappingAsyncSpansArePairs) {
  Snapshot snap = two_tracks();
  // Two collectives in flight at once on one communicator, the first with a phase inside.
  snap.records.push_back(span(1, 0, 10'000, "all_reduce", Category::comm, RecordKind::async_span));
  snap.records.push_back(
      span(1, 1'000, 4'000, "ring.reduce_scatter", Category::step, RecordKind::async_span));
  snap.records.push_back(
      span(1, 2'000, 15'000, "all_gather", Category::comm, RecordKind::async_span));
  snap.records.push_back(
      span(1, 20'000, 21'000, "barrier", Category::comm, RecordKind::async_span));
  const json trace = exported(snap);
  std::set<std::string> complete;
  for (const json& e : events_with(trace, "X")) complete.insert(e["name"]);
  EXPECT_EQ(complete, (std::set<std::string>{"all_reduce", "ring.reduce_scatter", "barrier"}));
  const auto begins = events_with(trace, "b");
  const auto ends = events_with(trace, "e");
  ASSERT_EQ(begins.size(), 1u);
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(begins[0]["name"], "all_gather");
  EXPECT_EQ(begins[0]["id"], ends[0]["id"]);
  EXPECT_EQ(begins[0]["cat"], ends[0]["cat"]);
  EXPECT_DOUBLE_EQ(ends[0]["ts"].get<double>() - begins[0]["ts"].get<double>(), 13.0);
}

TEST(ChromeTrace, CarriesBytesArgumentsAndTextAndEscapesNames) {
  Snapshot snap = two_tracks();
  Record r = span(1, 0, 1'500, "odd \"name\"\n\\");
  r.bytes = 4096;
  r.args[0] = Arg{"seq", 12};
  r.arg_count = 1;
  r.text_key = "algorithm";
  r.text = "ring";
  snap.records.push_back(r);
  const json trace = exported(snap);
  const auto complete = events_with(trace, "X");
  ASSERT_EQ(complete.size(), 1u);
  EXPECT_EQ(complete[0]["name"], "odd \"name\"\n\\");
  EXPECT_EQ(complete[0]["args"]["bytes"], 4096);
  EXPECT_EQ(complete[0]["args"]["seq"], 12);
  EXPECT_EQ(complete[0]["args"]["algorithm"], "ring");
  EXPECT_DOUBLE_EQ(complete[0]["dur"].get<double>(), 1.5) << "nanoseconds survive as decimals";
}

TEST(TraceOutput, WritesTheRankFileOnDemandAndRefusesAnUnusableDirectory) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("braid-trace-output-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  set_output(dir, {.rank = 5, .world_size = 8});
  EXPECT_TRUE(enabled()) << "setting an output turns tracing on";
  bool hook_ran = false;
  const std::uint64_t hook = add_write_hook([&] { hook_ran = true; });
  { Span s(Category::compute, "work"); }
  const auto written = write();
  remove_write_hook(hook);
  ASSERT_TRUE(written.has_value());
  EXPECT_EQ(written->filename(), "rank-5.trace.json");
  EXPECT_TRUE(hook_ran);
  std::ifstream in(*written);
  std::stringstream text;
  text << in.rdbuf();
  const json trace = json::parse(text.str());
  bool found = false;
  for (const json& e : trace["traceEvents"]) found = found || e["name"] == "work";
  EXPECT_TRUE(found) << "the span recorded before the write is in the file";

  const auto file_in_the_way = dir / "not-a-directory";
  std::ofstream(file_in_the_way) << "x";
  try {
    set_output(file_in_the_way, {.rank = 5});
    FAIL() << "a file is not a trace directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(Errc::invalid_argument));
    EXPECT_NE(std::string(e.what()).find("not-a-directory"), std::string::npos) << e.what();
  }
  clear_output();
  EXPECT_FALSE(write().has_value());
  set_enabled(false);
  clear();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace braid::trace
