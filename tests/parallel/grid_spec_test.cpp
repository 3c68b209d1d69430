// GridSpec and Axes (grid_spec.hpp): axis lists, order strings, and degrees from options
// or the BRAID_TP/CP/DP/PP and BRAID_GRID_ORDER knobs.
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/parallel/grid_spec.hpp>

#include "../support/expect_error.hpp"

namespace braid::parallel {
namespace {

using braid::testing::expect_invalid_argument;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

config::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

void expect_invalid_environment(const auto& call, std::string_view needle) {
  try {
    call();
    ADD_FAILURE() << "no error for " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_environment) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(needle));
  }
}

TEST(Axes, AreSetsWhateverOrderTheyAreNamedIn) {
  EXPECT_EQ(Axes::parse("tp-dp"), (Axes{Axis::tp, Axis::dp}));
  EXPECT_EQ(Axes::parse("dp-tp"), (Axes{Axis::dp, Axis::tp}));
  EXPECT_EQ(Axes::parse(" pp "), Axes(Axis::pp));
  EXPECT_EQ(Axes::parse("pp-dp-cp-tp").name(), "tp-cp-dp-pp");
  EXPECT_EQ(Axes::parse("dp-cp").name(), "cp-dp");
  EXPECT_TRUE(Axes{}.empty());
  EXPECT_EQ(Axes{}.name(), "none");
  EXPECT_EQ(Axes::from_mask(Axes{Axis::cp, Axis::pp}.mask()), (Axes{Axis::cp, Axis::pp}));
}

TEST(Axes, UnknownRepeatedOrMissingNamesAreInvalidArguments) {
  expect_invalid_argument([] { Axes::parse("tp-ep"); }, "'ep' is not an axis (the axes are tp");
  expect_invalid_argument([] { Axes::parse("tp-dp-tp"); }, "axes='tp-dp-tp' names tp twice");
  expect_invalid_argument([] { Axes::parse(""); }, "names no axis");
  expect_invalid_argument([] { Axes::parse("tp--dp"); }, "'' is not an axis");
  expect_invalid_argument([] { Axes::parse("TP"); }, "'TP' is not an axis");
}

TEST(GridSpec, DefaultsAreOneForTpCpPpDpInferredAndTheTpCpDpPpOrder) {
  const GridSpec spec = GridSpec::from_options({}, env_of({}));
  EXPECT_EQ(spec.degrees, (std::array<int, axis_count>{1, 1, 0, 1}));
  EXPECT_THAT(spec.order, ElementsAre(Axis::tp, Axis::cp, Axis::dp, Axis::pp));
  EXPECT_EQ(spec.describe(), "tp=1 cp=1 dp=auto pp=1 order tp-cp-dp-pp");
  EXPECT_EQ(spec.resolved_dp(8), 8);
}

TEST(GridSpec, KnobsFillWhatTheOptionsLeaveUnset) {
  const auto env = env_of({{"BRAID_TP", "4"},
                           {"BRAID_CP", "2"},
                           {"BRAID_PP", " 3 "},
                           {"BRAID_DP", "5"},
                           {"BRAID_GRID_ORDER", "tp-pp-dp-cp"}});
  const GridSpec from_env = GridSpec::from_options({}, env);
  EXPECT_EQ(from_env.describe(), "tp=4 cp=2 dp=5 pp=3 order tp-pp-dp-cp");

  const GridSpec mixed = GridSpec::from_options({.tp = 2, .dp = 0, .order = "tp-dp"}, env);
  EXPECT_EQ(mixed.describe(), "tp=2 cp=2 dp=auto pp=3 order tp-dp");
}

TEST(GridSpec, MalformedKnobsAreInvalidEnvironmentNamingTheVariable) {
  expect_invalid_environment(
      [] {
        GridSpec::from_options({}, env_of({{"BRAID_TP", "two"}}));
      },
      "BRAID_TP='two' is not an integer");
  expect_invalid_environment(
      [] {
        GridSpec::from_options({}, env_of({{"BRAID_PP", "0"}}));
      },
      "BRAID_PP=0 is not a degree (at least 1)");
  expect_invalid_environment(
      [] {
        GridSpec::from_options({}, env_of({{"BRAID_DP", "-2"}}));
      },
      "BRAID_DP=-2 is not a degree (at least 1, or 0 to infer it)");
  expect_invalid_environment(
      [] {
        GridSpec::from_options({}, env_of({{"BRAID_CP", "4294967296"}}));
      },
      "BRAID_CP=4294967296 is not a degree");
  expect_invalid_environment(
      [] {
        GridSpec::from_options({}, env_of({{"BRAID_GRID_ORDER", "tp-dp-dp"}}));
      },
      "BRAID_GRID_ORDER='tp-dp-dp' names dp twice");
  expect_invalid_environment(
      [] {
        GridSpec::from_options({}, env_of({{"BRAID_GRID_ORDER", "tp-mp"}}));
      },
      "BRAID_GRID_ORDER='tp-mp': 'mp' is not an axis");
  // An option given makes the knob unread, malformed or not.
  EXPECT_EQ(GridSpec::from_options({.tp = 2}, env_of({{"BRAID_TP", "two"}})).degree(Axis::tp), 2);
}

TEST(GridSpec, BadOptionsAreInvalidArguments) {
  expect_invalid_argument([] { GridSpec::from_options({.tp = 0}, env_of({})); },
                          "tp=0 is not a degree (at least 1)");
  expect_invalid_argument([] { GridSpec::from_options({.dp = -1}, env_of({})); },
                          "dp=-1 is not a degree (at least 1, or 0 to infer it)");
  expect_invalid_argument([] { GridSpec::from_options({.order = "tp-dp-pp-"}, env_of({})); },
                          "order='tp-dp-pp-': '' is not an axis");
  expect_invalid_argument([] { GridSpec::from_options({.order = " "}, env_of({})); },
                          "order=' ' names no axis");
}

TEST(GridSpec, DpIsInferredOnlyWhereTheOtherDegreesDivideTheWorld) {
  const GridSpec spec = GridSpec::from_options({.tp = 2, .cp = 1, .pp = 3}, env_of({}));
  EXPECT_EQ(spec.resolved_dp(12), 2);
  EXPECT_EQ(spec.resolved_dp(8), 0);
  EXPECT_EQ(spec.resolved_dp(4), 0);
  const GridSpec huge =
      GridSpec::from_options({.tp = 1 << 30, .cp = 1 << 30, .pp = 1 << 30}, env_of({}));
  EXPECT_EQ(huge.resolved_dp(1 << 30), 0);
}

TEST(GridSpec, LayoutsCompareEqualWhenOnlyDegreeOneAxesMove) {
  const GridSpec named =
      GridSpec::from_options({.tp = 2, .dp = 2, .order = "tp-cp-dp-pp"}, env_of({}));
  const GridSpec short_order =
      GridSpec::from_options({.tp = 2, .dp = 2, .order = "tp-dp"}, env_of({}));
  const GridSpec swapped = GridSpec::from_options({.tp = 2, .dp = 2, .order = "dp-tp"}, env_of({}));
  const GridSpec other_degrees = GridSpec::from_options({.tp = 1, .dp = 4}, env_of({}));
  EXPECT_TRUE(named.same_layout(short_order));
  EXPECT_FALSE(named.same_layout(swapped));
  EXPECT_FALSE(named.same_layout(other_degrees));
}

}  // namespace
}  // namespace braid::parallel
