#include <map>
#include <set>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/config.hpp>
#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>
#include <braid/core/log.hpp>

using ::testing::HasSubstr;

namespace braid::config {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(Config, EveryKnobIsNamedBraidAndDocumentedOnce) {
  std::set<std::string_view> seen;
  for (const Knob& k : knobs()) {
    EXPECT_TRUE(k.name.starts_with("BRAID_")) << k.name;
    EXPECT_FALSE(k.doc.empty()) << k.name;
    EXPECT_TRUE(seen.insert(k.name).second) << k.name << " declared twice";
  }
}

TEST(Config, UnsetOrEmptyVariablesFallBackToTheDefault) {
  EXPECT_EQ(string_value("BRAID_LOG_LEVEL", env_of({})), "warn");
  EXPECT_EQ(string_value("BRAID_LOG_LEVEL", env_of({{"BRAID_LOG_LEVEL", ""}})), "warn");
  EXPECT_EQ(string_value("BRAID_LOG_LEVEL", env_of({{"BRAID_LOG_LEVEL", " debug "}})), "debug");
}

TEST(Config, TrimTakesTheBlanksAroundAValueAndNothingInside) {
  EXPECT_EQ(trim(" \t4 KiB\r\n"), "4 KiB");
  EXPECT_EQ(trim("x"), "x");
  EXPECT_EQ(trim(" \n\t "), "");
  EXPECT_EQ(trim(""), "");
}

TEST(Config, ParsesIntegersBooleansAndSeconds) {
  EXPECT_EQ(int_value("BRAID_UCX_SPIN_US", env_of({{"BRAID_UCX_SPIN_US", "25"}})), 25);
  EXPECT_EQ(seconds_value("BRAID_TIMEOUT", env_of({{"BRAID_TIMEOUT", "2.5"}})),
            std::chrono::milliseconds(2500));
  EXPECT_TRUE(parse_bool("yes", "X"));
  EXPECT_FALSE(parse_bool("0", "X"));
  EXPECT_EQ(parse_cpu_list("3", "X"), std::vector<int>{3});
  EXPECT_EQ(parse_cpu_list(" 4-6,0, 5 ", "X"), (std::vector<int>{0, 4, 5, 6}));
}

TEST(Config, MalformedValuesAreErrorsNamingTheVariable) {
  try {
    int_value("BRAID_UCX_SPIN_US", env_of({{"BRAID_UCX_SPIN_US", "12us"}}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_environment);
    EXPECT_THAT(e.what(), HasSubstr("BRAID_UCX_SPIN_US='12us' is not an integer"));
  }
  EXPECT_THROW(seconds_value("BRAID_TIMEOUT", env_of({{"BRAID_TIMEOUT", "-1"}})), Error);
  EXPECT_THROW(seconds_value("BRAID_TIMEOUT", env_of({{"BRAID_TIMEOUT", "nan"}})), Error);
  EXPECT_THROW(parse_bool("maybe", "BRAID_X"), Error);
  for (const char* list : {"", "1,", "3-1", "a", "1-", "-1", "100000"}) {
    EXPECT_THROW(parse_cpu_list(list, "BRAID_RUNTIME_CPUS"), Error) << list;
  }
}

TEST(Config, SizesInKibAreBytesWithinTheirRangeAndErrorsNamingItOutside) {
  EXPECT_EQ(kib_value("BRAID_RING_PIECE_KIB", 1, 1024, env_of({})), std::size_t{256} << 10);
  EXPECT_EQ(kib_value("BRAID_RING_PIECE_KIB", 1, 1024, env_of({{"BRAID_RING_PIECE_KIB", "1"}})),
            std::size_t{1024});
  for (const char* outside : {"0", "1025", "-3"}) {
    try {
      kib_value("BRAID_RING_PIECE_KIB", 1, 1024, env_of({{"BRAID_RING_PIECE_KIB", outside}}));
      FAIL() << "no error for " << outside;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_environment);
      EXPECT_THAT(e.what(), HasSubstr(fmt::format("BRAID_RING_PIECE_KIB={} is outside 1..1024 KiB",
                                                  outside)));
    }
  }
}

TEST(Config, ReadingAnUndeclaredKnobIsAnInvariantError) {
  EXPECT_THROW(string_value("BRAID_NOT_A_KNOB", env_of({})), InvariantError);
}

TEST(Config, DescribeListsEveryKnobWithItsValueInForce) {
  auto text = describe(env_of({{"BRAID_TIMEOUT", "7"}}));
  for (const Knob& k : knobs()) EXPECT_THAT(text, HasSubstr(std::string(k.name)));
  EXPECT_THAT(text, HasSubstr("BRAID_TIMEOUT"));
  EXPECT_THAT(text, HasSubstr(" 7 "));
  EXPECT_THAT(text, HasSubstr("(unset)"));
}

TEST(Log, LevelFiltersAndRankIsPerThreadOverProcess) {
  log::set_level(log::Level::info);
  EXPECT_TRUE(log::enabled(log::Level::error));
  EXPECT_FALSE(log::enabled(log::Level::debug));
  log::set_process_rank(4);
  EXPECT_EQ(log::current_rank(), 4);
  log::set_thread_rank(1);
  EXPECT_EQ(log::current_rank(), 1);
  log::set_thread_rank(-1);
  EXPECT_EQ(log::current_rank(), 4);
  log::set_level(log::Level::off);
  EXPECT_FALSE(log::enabled(log::Level::critical));
}

}  // namespace
}  // namespace braid::config
