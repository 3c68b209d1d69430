// braid-trace's reading side: ranks lined up on one clock, merge keeping that alignment,
// and bad input refused with a message naming the file -- through the library and through
// the braid-trace command (BRAID_TRACE_TOOL), whose exit status says what went wrong.
#include "trace_set.hpp"

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "html.hpp"

namespace braid::tools::trace_tool {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

class TraceDirectory : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("braid-trace-set-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return dir_ / name;
  }
  // A rank file as the exporter writes it: times from origin_ns on the rank's own clock.
  void write_rank(int rank, std::int64_t origin_ns, std::int64_t offset_ns, json events) {
    json trace = {{"distributedInfo", {{"backend", "braid"}, {"rank", rank}, {"world_size", 2}}},
                  {"braid",
                   {{"format", "braid-trace"},
                    {"version", 1},
                    {"rank", rank},
                    {"world_size", 2},
                    {"host", "h" + std::to_string(rank)},
                    {"clock",
                     {{"origin_ns", origin_ns},
                      {"reference_rank", 0},
                      {"offset_ns", offset_ns},
                      {"round_trip_ns", 1000}}}}},
                  {"traceEvents", std::move(events)}};
    write("rank-" + std::to_string(rank) + ".trace.json", trace.dump());
  }
  static json complete(int pid, double ts, double dur, const std::string& cat,
                       const std::string& name) {
    return {{"ph", "X"},  {"pid", pid}, {"tid", 1},    {"ts", ts},
            {"dur", dur}, {"cat", cat}, {"name", name}};
  }

  fs::path dir_;
};

TEST_F(TraceDirectory, RanksAreAlignedOnTheReferenceClockFromTheJobsFirstEvent) {
  write_rank(0, 1'000'000, 0, json::array({complete(0, 10.0, 5.0, "comm", "all_reduce")}));
  write_rank(1, 5'000'000, -3'990'000,
             json::array({complete(1, 0.0, 5.0, "comm", "all_reduce"),
                          complete(1, 20.0, 1.0, "compute", "backward")}));
  const TraceSet set = TraceSet::load(dir_);
  EXPECT_EQ(set.origin_ns(), 1'010'000);
  const trace::Timeline timeline = set.timeline();
  ASSERT_EQ(timeline.ranks.size(), 2u);
  EXPECT_EQ(timeline.world_size, 2);
  EXPECT_EQ(timeline.ranks[0].events.at(0).begin_ns, 0);
  EXPECT_EQ(timeline.ranks[1].events.at(0).begin_ns, 0) << "the same instant on both ranks";
  EXPECT_EQ(timeline.ranks[1].events.at(1).begin_ns, 20'000);
  EXPECT_EQ(timeline.ranks[1].events.at(1).end_ns, 21'000);
  EXPECT_EQ(timeline.ranks[1].host, "h1");
  EXPECT_EQ(timeline.ranks[1].clock.offset_ns, -3'990'000);

  const json merged = set.merged();
  EXPECT_EQ(merged["braid"]["format"], "braid-trace-merged");
  EXPECT_EQ(merged["braid"]["world_size"], 2);
  std::map<int, std::vector<double>> starts;
  for (const json& e : merged["traceEvents"]) starts[e["pid"]].push_back(e["ts"]);
  EXPECT_EQ(starts[0], std::vector<double>{0.0});
  EXPECT_EQ(starts[1], (std::vector<double>{0.0, 20.0}));

  // A merged file reads back as the same timeline.
  const fs::path merged_file = dir_ / "merged" / "all.json";
  fs::create_directories(merged_file.parent_path());
  std::ofstream(merged_file) << merged.dump();
  const trace::Timeline again = TraceSet::load(merged_file).timeline();
  ASSERT_EQ(again.ranks.size(), 2u);
  EXPECT_EQ(again.ranks[1].events.at(1).begin_ns, 20'000);
}

TEST_F(TraceDirectory, AsyncPairsBecomeSpansAndArgumentsSurvive) {
  write_rank(0, 0, 0,
             json::array({json{{"ph", "b"},
                               {"pid", 0},
                               {"tid", 2},
                               {"ts", 1.0},
                               {"cat", "comm"},
                               {"name", "all_gather"},
                               {"id", "0x1"},
                               {"args", {{"bytes", 64}, {"algorithm", "ring"}}}},
                          json{{"ph", "e"},
                               {"pid", 0},
                               {"tid", 2},
                               {"ts", 4.5},
                               {"cat", "comm"},
                               {"name", "all_gather"},
                               {"id", "0x1"}}}));
  const trace::Timeline timeline = TraceSet::load(dir_).timeline();
  ASSERT_EQ(timeline.ranks.at(0).events.size(), 1u);
  const trace::TimelineEvent& e = timeline.ranks[0].events[0];
  EXPECT_EQ(e.duration_ns(), 3'500);
  EXPECT_EQ(e.bytes, 64u);
  EXPECT_EQ(e.arg("algorithm"), "ring");
}

void expect_refused(const fs::path& path, const std::string& says) {
  try {
    (void)TraceSet::load(path).timeline();
    FAIL() << path << " should be refused";
  } catch (const TraceInputError& e) {
    EXPECT_NE(std::string(e.what()).find(path.filename().string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST_F(TraceDirectory, BadInputIsRefusedNamingTheFileAndTheProblem) {
  expect_refused(write("garbage.json", "this is not json"), "not valid JSON");
  expect_refused(write("truncated.json", R"({"traceEvents":[{"ph":"X","ts":1,)"), "not valid JSON");
  expect_refused(write("schema.json", R"({"events":[]})"), "\"traceEvents\" array");
  expect_refused(write("no_phase.json", R"({"traceEvents":[{"ts":1}]})"), "no \"ph\"");
  expect_refused(write("no_ts.json", R"({"traceEvents":[{"ph":"X","dur":1}]})"),
                 "no numeric \"ts\"");
  expect_refused(write("no_dur.json", R"({"traceEvents":[{"ph":"X","ts":1}]})"), "\"dur\"");
  expect_refused(write("lonely_end.json",
                       R"({"traceEvents":[{"ph":"e","ts":1,"name":"a","cat":"comm","id":1}]})"),
                 "never began");
  const fs::path empty = dir_ / "empty";
  fs::create_directories(empty);
  expect_refused(empty, "no trace files");
  expect_refused(dir_ / "missing", "does not exist");
}

TEST_F(TraceDirectory, TimesBeyondAnyClockAreRefusedNotPrintedAsNonsense) {
  // 1e300 us overflowed the nanosecond sums; -1e15 printed a wall time of -9.2e18 ns.
  expect_refused(write("huge_ts.json", R"({"traceEvents":[{"ph":"X","ts":1e300,"dur":1}]})"),
                 "outside 0 to 3e15 microseconds");
  expect_refused(write("negative_ts.json", R"({"traceEvents":[{"ph":"i","ts":-1e15}]})"),
                 "outside 0 to 3e15 microseconds");
  expect_refused(write("huge_dur.json", R"({"traceEvents":[{"ph":"X","ts":1,"dur":1e20}]})"),
                 "\"dur\" from 0 to 3e15");
  write_rank(0, 4'000'000'000'000'000'000, 0, json::array());
  expect_refused(dir_ / "rank-0.trace.json", "beyond any clock");
}

TEST_F(TraceDirectory, FieldsOfTheWrongTypeAreRefusedNamingTheField) {
  // These gave nlohmann's raw json.exception.type_error text.
  expect_refused(
      write("thread_name.json",
            R"({"traceEvents":[{"ph":"M","name":"thread_name","pid":0,"tid":1,"args":7}]})"),
      "\"args\" that are not an object");
  expect_refused(
      write(
          "thread_name_number.json",
          R"({"traceEvents":[{"ph":"M","name":"thread_name","pid":0,"tid":1,"args":{"name":7}}]})"),
      "text \"name\"");
  expect_refused(write("event_name.json", R"({"traceEvents":[{"ph":"i","ts":1,"name":5}]})"),
                 "\"name\" that is not text");
  json header = {{"braid",
                  {{"format", "braid-trace"},
                   {"rank", "zero"},
                   {"clock", {{"origin_ns", 0}, {"offset_ns", 0}}}}},
                 {"traceEvents", json::array()}};
  expect_refused(write("text_rank.json", header.dump()), "no integer \"rank\"");
}

// ---------------------------------------------------------------- the command

struct CommandResult {
  int status = -1;
  std::string output;
};

CommandResult braid_trace(const std::string& arguments) {
  const char* tool = std::getenv("BRAID_TRACE_TOOL");
  if (tool == nullptr) return {};
  const std::string command = std::string(tool) + " " + arguments + " 2>&1";
  CommandResult run;
  FILE* pipe = ::popen(command.c_str(), "r");
  std::array<char, 4096> chunk{};
  while (std::size_t n = std::fread(chunk.data(), 1, chunk.size(), pipe)) {
    run.output.append(chunk.data(), n);
  }
  const int status = ::pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

TEST_F(TraceDirectory, TheCommandExitsOneOnBadInputAndTwoOnMisuse) {
  if (std::getenv("BRAID_TRACE_TOOL") == nullptr) GTEST_SKIP() << "BRAID_TRACE_TOOL not set";
  write("truncated.json", R"({"traceEvents":[)");
  CommandResult bad = braid_trace("summary " + dir_.string());
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_NE(bad.output.find("truncated.json"), std::string::npos) << bad.output;

  // What summary refuses, merge and html refuse too (merge once wrote it out).
  fs::remove(dir_ / "truncated.json");
  write("lonely_end.json", R"({"traceEvents":[{"ph":"e","ts":1,"name":"a","cat":"comm","id":1}]})");
  for (const std::string command : {"summary", "html", "merge"}) {
    CommandResult run =
        braid_trace(command + " " + dir_.string() + " -o " + (dir_ / "merged.json").string());
    EXPECT_EQ(run.status, 1) << command << ": " << run.output;
    EXPECT_NE(run.output.find("never began"), std::string::npos) << command << ": " << run.output;
  }
  fs::remove(dir_ / "lonely_end.json");

  const fs::path empty = dir_ / "empty";
  fs::create_directories(empty);
  for (const std::string command : {"summary", "html", "merge"}) {
    CommandResult run =
        braid_trace(command + " " + empty.string() + " -o " + (dir_ / "out").string());
    EXPECT_EQ(run.status, 1) << command << ": " << run.output;
    EXPECT_NE(run.output.find("no trace files"), std::string::npos) << run.output;
  }
  EXPECT_EQ(braid_trace("html " + dir_.string()).status, 2) << "html needs -o";
  EXPECT_EQ(braid_trace("frobnicate " + dir_.string()).status, 2);
  EXPECT_EQ(braid_trace("").status, 2);
}

TEST_F(TraceDirectory, TheCommandSummarisesMergesAndDraws) {
  if (std::getenv("BRAID_TRACE_TOOL") == nullptr) GTEST_SKIP() << "BRAID_TRACE_TOOL not set";
  write_rank(0, 0, 0,
             json::array({complete(0, 0.0, 100.0, "compute", "backward"),
                          complete(0, 80.0, 100.0, "comm", "all_reduce")}));
  CommandResult summary = braid_trace("summary --json " + dir_.string());
  ASSERT_EQ(summary.status, 0) << summary.output;
  const json figures = json::parse(summary.output);
  EXPECT_DOUBLE_EQ(figures["job"]["overlap_percent"].get<double>(), 20.0);
  EXPECT_EQ(figures["job"]["exposed_communication_ns"], 80'000);

  const fs::path out = dir_ / "out";
  fs::create_directories(out);
  ASSERT_EQ(braid_trace("merge " + dir_.string() + " -o " + (out / "merged.json").string()).status,
            0);
  EXPECT_EQ(json::parse(std::ifstream(out / "merged.json"))["traceEvents"].size(), 2u);
  ASSERT_EQ(braid_trace("html " + dir_.string() + " -o " + (out / "t.html").string()).status, 0);
  std::ifstream html(out / "t.html");
  const std::string page((std::istreambuf_iterator<char>(html)), std::istreambuf_iterator<char>());
  EXPECT_NE(page.find("<canvas"), std::string::npos);
  EXPECT_NE(page.find("all_reduce"), std::string::npos);
  EXPECT_EQ(page.find("http://"), std::string::npos) << "self-contained: no network references";
  EXPECT_EQ(page.find("https://"), std::string::npos);
}

// Rank 1's clock runs 3.99 ms behind rank 0's: on the aligned clock it enters the
// all-reduce 20 us after rank 0 (10 us by the raw timestamps), and both leave together.
TEST_F(TraceDirectory, TheCommandSplitsWaitingFromTransferOnTheAlignedClock) {
  if (std::getenv("BRAID_TRACE_TOOL") == nullptr) GTEST_SKIP() << "BRAID_TRACE_TOOL not set";
  auto all_reduce = [](int pid, double ts, double dur) {
    json e = complete(pid, ts, dur, "comm", "all_reduce");
    e["args"] = {{"comm", 1}, {"seq", 0}, {"algorithm", "ring"}};
    return e;
  };
  write_rank(0, 1'000'000, 0, json::array({all_reduce(0, 10.0, 30.0)}));
  write_rank(1, 5'000'000, -3'990'000, json::array({all_reduce(1, 20.0, 10.0)}));
  CommandResult summary = braid_trace("summary --json " + dir_.string());
  ASSERT_EQ(summary.status, 0) << summary.output;
  const json figures = json::parse(summary.output);
  EXPECT_EQ(figures["ranks"][0]["waiting_ns"], 20'000);
  EXPECT_EQ(figures["ranks"][0]["transfer_ns"], 10'000);
  EXPECT_EQ(figures["ranks"][1]["waiting_ns"], 0);
  EXPECT_EQ(figures["ranks"][1]["late_calls"], 1);
  EXPECT_EQ(figures["job"]["most_waited_for"]["rank"], 1);

  CommandResult text = braid_trace("summary " + dir_.string());
  ASSERT_EQ(text.status, 0) << text.output;
  EXPECT_NE(text.output.find("waiting: ranks waited 20.0 us for rank 1 (50.0% of exposed)"),
            std::string::npos)
      << text.output;
  const fs::path page = dir_ / "out" / "t.html";
  fs::create_directories(page.parent_path());
  ASSERT_EQ(braid_trace("html " + dir_.string() + " -o " + page.string()).status, 0);
  std::ifstream html(page);
  const std::string body((std::istreambuf_iterator<char>(html)), std::istreambuf_iterator<char>());
  EXPECT_NE(body.find(">waiting ms</th>"), std::string::npos);
  EXPECT_NE(body.find("waiting: ranks waited 20.0 us for rank 1"), std::string::npos);
}

TEST(HtmlPage, NamesThatCouldCloseTheScriptAreEscapedInOnePass) {
  // 40,000 names holding "</" took 22 s when each escape moved the rest of the page.
  trace::Timeline timeline;
  timeline.world_size = 1;
  timeline.ranks.emplace_back();
  constexpr int kEvents = 40'000;
  for (int i = 0; i < kEvents; ++i) {
    // Distinct names: the page keeps one copy of each.
    timeline.ranks[0].events.push_back({.name = "</script><b>" + std::to_string(i),
                                        .category = "compute",
                                        .track = 1,
                                        .begin_ns = i * 10,
                                        .end_ns = i * 10 + 5});
  }
  const auto started = std::chrono::steady_clock::now();
  const std::string page =
      braid::tools::trace_tool::render_html(timeline, trace::summarize(timeline), "many names");
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  std::size_t escaped = 0;
  for (auto at = page.find("<\\/script><b>"); at != std::string::npos;
       at = page.find("<\\/script><b>", at + 1)) {
    ++escaped;
  }
  EXPECT_EQ(escaped, std::size_t{kEvents});
  EXPECT_EQ(page.find("</script><b>"), std::string::npos);
}

}  // namespace
}  // namespace braid::tools::trace_tool
