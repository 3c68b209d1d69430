#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/hostlist.hpp>

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

namespace braid::transport {
namespace {

struct Expansion {
  std::string list;
  std::vector<std::string> hosts;
};

// What `scontrol show hostnames LIST` printed for each list (Slurm 22.05).
const std::vector<Expansion> kSlurmExpansions{
    {"a,b,c", {"a", "b", "c"}},
    {"node-7.cluster", {"node-7.cluster"}},
    {"node[01-04,07]", {"node01", "node02", "node03", "node04", "node07"}},
    {"rack[1-2]-n[1-2]", {"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"}},
    {"a[1-3],b[5,7],c", {"a1", "a2", "a3", "b5", "b7", "c"}},
    {"n[8-11]", {"n8", "n9", "n10", "n11"}},
    {"n[098-101]", {"n098", "n099", "n100", "n101"}},
    {"n[1-03]", {"n1", "n2", "n3"}},
    {"n[01-3]", {"n01", "n02", "n03"}},
    {"n[1-2][3-4]", {"n13", "n14", "n23", "n24"}},
    {"x[1-2]y[3-4]", {"x1y3", "x1y4", "x2y3", "x2y4"}},
    {"n[00-02,5-6]", {"n00", "n01", "n02", "n5", "n6"}},
    {"n[2,1]", {"n2", "n1"}},
    {"n[1,1]", {"n1", "n1"}},
    {"n[5]", {"n5"}},
    {"n[007]", {"n007"}},
    {"[1-2]", {"1", "2"}},
};

// The invalid_environment error's message for `list`, read through `call`.
template <typename Call>
std::string error_for(Call call, const std::string& list) {
  try {
    call(list, "SLURM_JOB_NODELIST");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_environment);
    return e.detail();
  }
  ADD_FAILURE() << "accepted " << list;
  return "";
}

TEST(Hostlist, ExpandsAsSlurmDoes) {
  for (const auto& [list, hosts] : kSlurmExpansions) {
    EXPECT_THAT(expand_hostlist(list, "SLURM_JOB_NODELIST"), ElementsAreArray(hosts)) << list;
  }
}

TEST(Hostlist, FirstHostAndCountAgreeWithTheExpansion) {
  for (const auto& [list, hosts] : kSlurmExpansions) {
    EXPECT_EQ(first_host(list, "SLURM_JOB_NODELIST"), hosts.front()) << list;
    EXPECT_EQ(count_hosts(list, "SLURM_JOB_NODELIST"), static_cast<std::int64_t>(hosts.size()))
        << list;
  }
}

TEST(Hostlist, MalformedListsAreErrorsNamingTheVariableAndTheText) {
  // scontrol refuses most of these; a few it shrugs off (n[1-] as n1, a,,b as a b, n[1-2
  // as "n]"), but Slurm never writes them, so braid refuses rather than guesses.
  const std::vector<std::pair<std::string, std::string>> bad{
      {"", "an empty name at offset 0"},
      {"a,,b", "an empty name at offset 2"},
      {",a", "an empty name at offset 0"},
      {"a,", "an empty name at offset 2"},
      {"n[1-2", "the '[' at offset 1 is never closed"},
      {"n1-2]", "']' at offset 4 closes no '['"},
      {"n[[1]]", "a '[' inside the bracket group at offset 1"},
      {"n[3-1]", "the range '3-1' runs backwards"},
      {"n[010-9]", "the range '010-9' runs backwards"},
      {"n[a-b]", "'a-b' is not a number or a range of numbers such as 01-04"},
      {"n[]", "'' is not a number"},
      {"n[1,]", "'' is not a number"},
      {"n[-1]", "'-1' is not a number"},
      {"n[1-]", "'1-' is not a number"},
      {"n[1-2-3]", "'1-2-3' is not a number"},
      {"n[1234567890123456789]", "'1234567890123456789' has more than 18 digits"},
      {"n[1-3]x", "'x' follows the last bracket group of a name"},
      {"gpu[1-2]-ib,login", "'-ib' follows the last bracket group"},
      {"a b", "a blank at offset 1"},
  };
  for (const auto& [list, reason] : bad) {
    const std::string expected =
        fmt::format("SLURM_JOB_NODELIST='{}' is not a Slurm host list such as node[01-04,07]: {}",
                    list, reason);
    EXPECT_THAT(error_for(expand_hostlist, list), HasSubstr(expected));
    EXPECT_THAT(error_for(first_host, list), HasSubstr(expected));
    EXPECT_THAT(error_for(count_hosts, list), HasSubstr(expected));
  }
}

TEST(Hostlist, ListsOfMoreHostsThanABraidJobHasRanksAreRefusedUnexpanded) {
  // 1024 x 1024 = kMostRanks: counted, and its first host found, without expanding it.
  EXPECT_EQ(count_hosts("n[0000-1023]-r[0000-1023]", "L"), kMostRanks);
  EXPECT_EQ(first_host("n[0000-1023]-r[0000-1023]", "L"), "n0000-r0000");
  for (const std::string list :
       {"n[0-999999999]", "n[0-1023]-[0-1024]", "a[0-999999999999999999][0-999999999999999999]",
        "n[0-1048575],m"}) {
    const std::string expected =
        fmt::format("SLURM_JOB_NODELIST='{}' names more than {} hosts", list, kMostRanks);
    EXPECT_THAT(error_for(expand_hostlist, list), HasSubstr(expected));
    EXPECT_THAT(error_for(first_host, list), HasSubstr(expected));
    EXPECT_THAT(error_for(count_hosts, list), HasSubstr(expected));
  }
}

}  // namespace
}  // namespace braid::transport
