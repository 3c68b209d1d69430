// The bootstrap under Slurm: srun's step variables read, the allocation's left alone;
// task lists and node lists counted and checked against each other; the store on the
// step's first node at a port from the job and step ids; braid-run's reading of the step.
// The rules are the header comment of <braid/transport/bootstrap.hpp>.
#include <cstdint>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/transport/bootstrap.hpp>

#include "bootstrap_test_helpers.hpp"

using ::testing::HasSubstr;
using ::testing::Not;

namespace braid::transport {
namespace {

using namespace braid::transport::bootstrap_testing;

TEST(Bootstrap, ReadsSlurmWithUnevenTasksPerNode) {
  auto info = parse_launch_env(env_of({{"SLURM_PROCID", "9"},
                                       {"SLURM_STEP_NUM_TASKS", "10"},
                                       {"SLURM_LOCALID", "1"},
                                       {"SLURM_NODEID", "2"},
                                       {"SLURM_NNODES", "3"},
                                       {"SLURM_TASKS_PER_NODE", "4(x2),2"},
                                       {"MASTER_ADDR", "n0"},
                                       {"MASTER_PORT", "29500"}}));
  expect_ranks(info, 9, 10, 1, 2, 2, 3);
  EXPECT_EQ(info.source, "slurm");
}

TEST(Bootstrap, SlurmTaskListIsWalkedByNode) {
  Vars vars{{"SLURM_PROCID", "4"},  {"SLURM_STEP_NUM_TASKS", "10"},
            {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "1"},
            {"SLURM_NNODES", "3"},  {"SLURM_TASKS_PER_NODE", "4(x2),2"},
            {"BRAID_STORE", "n0:1"}};
  EXPECT_EQ(parse_launch_env(env_of(vars)).local_world_size, 4);
  vars["SLURM_TASKS_PER_NODE"] = "3,5,2";
  EXPECT_EQ(parse_launch_env(env_of(vars)).local_world_size, 5);
}

TEST(Bootstrap, SlurmUniformTasksPerNodeNeedsNoNodeId) {
  auto info = parse_launch_env(env_of({{"SLURM_PROCID", "5"},
                                       {"SLURM_STEP_NUM_TASKS", "8"},
                                       {"SLURM_NTASKS_PER_NODE", "4"},
                                       {"BRAID_STORE", "n0:29500"}}));
  expect_ranks(info, 5, 8, 1, 4, 1, 2);
  info = parse_launch_env(env_of({{"SLURM_PROCID", "2"},
                                  {"SLURM_STEP_NUM_TASKS", "4"},
                                  {"SLURM_NNODES", "1"},
                                  {"SLURM_TASKS_PER_NODE", "4"}}));
  expect_ranks(info, 2, 4, 2, 4, 0, 1);
  EXPECT_EQ(info.store_host, "127.0.0.1");
}

TEST(Bootstrap, MalformedSlurmTaskListsAreErrors) {
  Vars vars{{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_NODEID", "0"}};
  for (const char* list : {"4(x", "4(2)", "x", "4,,2", "4(x2", "0", "4(x2)3", "4,"}) {
    vars["SLURM_TASKS_PER_NODE"] = list;
    EXPECT_THAT(
        error_for(vars),
        HasSubstr(fmt::format("SLURM_TASKS_PER_NODE='{}' is not a Slurm task count list", list)));
  }
  vars["SLURM_TASKS_PER_NODE"] = "2(x2)";
  vars["SLURM_NODEID"] = "2";
  vars["SLURM_PROCID"] = "3";
  EXPECT_THAT(error_for(vars),
              HasSubstr("SLURM_NODEID=2 is beyond the 2 node(s) in SLURM_TASKS_PER_NODE='2(x2)'"));
  vars.erase("SLURM_NODEID");
  vars["SLURM_TASKS_PER_NODE"] = "3,1";
  EXPECT_THAT(error_for(vars),
              HasSubstr("SLURM_TASKS_PER_NODE='3,1' differs between nodes but SLURM_NODEID is "
                        "not set"));
}

TEST(Bootstrap, SlurmAllocationWithoutAStepIsNotALaunch) {
  // salloc shells carry the allocation's SLURM_*, SLURM_PROCID among them, but srun alone
  // starts a step and sets SLURM_STEP_NUM_TASKS.
  EXPECT_THAT(error_for({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "1"}}),
              HasSubstr("no launcher environment"));
}

TEST(Bootstrap, AnSbatchScriptsOwnProcessIsNoLauncherEnvironment) {
  // The batch script runs once, on the first node, with the allocation's numbers: read as
  // rank 0 of 64 it would wait at join for 63 ranks nobody starts.
  Vars vars{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "64"}, {"SLURM_NNODES", "1"},
            {"SLURM_NODEID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_ID", "4242"}};
  EXPECT_THAT(error_for(vars), HasSubstr("no launcher environment"));
  EXPECT_FALSE(parse_slurm_step(env_of(vars)));
  // So a single process runs there as it runs anywhere, and nothing else is reported.
  vars["BRAID_WORLD_SIZE"] = "1";
  auto info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.source, "braid");
  expect_ranks(info, 0, 1, 0, 1, 0, 1);
  EXPECT_EQ(info.store_port, 0);
  EXPECT_TRUE(info.outranked.empty());
}

TEST(Bootstrap, WithinAStepTheOlderSlurmNamesStandInForUnsetStepNames) {
  Vars vars{{"SLURM_PROCID", "3"}, {"SLURM_STEP_NUM_TASKS", "4"},     {"SLURM_NODEID", "1"},
            {"SLURM_NNODES", "2"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"BRAID_STORE", "h:1"}};
  auto info = parse_launch_env(env_of(vars));
  expect_ranks(info, 3, 4, 1, 2, 1, 2);
  EXPECT_THAT(info.description, HasSubstr("SLURM_TASKS_PER_NODE='2(x2)' gives node 1"));
  EXPECT_THAT(info.description, HasSubstr("SLURM_NNODES=2"));
  // But not for the world size: SLURM_NTASKS may be the allocation's (srun --preserve-env).
  vars["SLURM_NTASKS"] = "16";
  EXPECT_EQ(parse_launch_env(env_of(vars)).world_size, 4);
}

TEST(Bootstrap, SlurmPrefersTheStepsVariablesToTheAllocations) {
  // srun --preserve-env inside an allocation of 4 nodes x 4 tasks, starting 2 x 2 tasks:
  // SLURM_NTASKS, SLURM_NNODES, SLURM_TASKS_PER_NODE and SLURM_JOB_NODELIST still
  // describe the allocation.
  auto info = parse_launch_env(env_of({{"SLURM_PROCID", "3"},
                                       {"SLURM_LOCALID", "1"},
                                       {"SLURM_NODEID", "1"},
                                       {"SLURM_NTASKS", "16"},
                                       {"SLURM_NNODES", "4"},
                                       {"SLURM_TASKS_PER_NODE", "4(x4)"},
                                       {"SLURM_JOB_NODELIST", "n[1-4]"},
                                       {"SLURM_STEP_NUM_TASKS", "4"},
                                       {"SLURM_STEP_NUM_NODES", "2"},
                                       {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                                       {"SLURM_STEP_NODELIST", "n[3-4]"},
                                       {"SLURM_JOB_ID", "7"}}));
  expect_ranks(info, 3, 4, 1, 2, 1, 2);
  EXPECT_EQ(info.store_host, "n3");
  EXPECT_EQ(info.store_port, slurm_step_port(7, 0));  // SLURM_STEP_ID unset: step 0
}

TEST(Bootstrap, SlurmStoreIsOnTheStepsFirstNodeAtAPortFromTheJobAndStepIds) {
  Vars vars{{"SLURM_PROCID", "3"},
            {"SLURM_STEP_NUM_TASKS", "4"},
            {"SLURM_LOCALID", "1"},
            {"SLURM_NODEID", "1"},
            {"SLURM_NNODES", "2"},
            {"SLURM_TASKS_PER_NODE", "2(x2)"},
            {"SLURM_JOB_NODELIST", "node[0-1]"},
            {"SLURM_JOB_ID", "123456"},
            {"SLURM_STEP_ID", "2"}};
  auto info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.store_host, "node0");
  EXPECT_EQ(info.store_port, slurm_step_port(123456, 2));
  EXPECT_EQ(info.token, "");
  vars["SLURM_STEP_NODELIST"] = "gpu[07-08]";
  info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.store_host, "gpu07");
  auto address = slurm_store_address(env_of(vars));
  ASSERT_TRUE(address);
  EXPECT_EQ(address->host, "gpu07");
  EXPECT_EQ(address->port, slurm_step_port(123456, 2));
  // BRAID_STORE and MASTER_ADDR/MASTER_PORT still come first.
  vars["MASTER_ADDR"] = "m";
  vars["MASTER_PORT"] = "1";
  EXPECT_EQ(parse_launch_env(env_of(vars)).store_host, "m");
  vars["BRAID_STORE"] = "b:2";
  EXPECT_EQ(parse_launch_env(env_of(vars)).store_host, "b");
}

TEST(Bootstrap, SlurmOnOneNodeServesTheStoreOnLoopbackAtTheStepsPort) {
  Vars vars{{"SLURM_PROCID", "1"},
            {"SLURM_STEP_NUM_TASKS", "4"},
            {"SLURM_NNODES", "1"},
            {"SLURM_JOB_NODELIST", "node7"},
            {"SLURM_JOB_ID", "42"}};
  auto info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.store_host, "127.0.0.1");
  EXPECT_EQ(info.store_port, slurm_step_port(42, 0));
  vars.erase("SLURM_JOB_ID");
  EXPECT_EQ(parse_launch_env(env_of(vars)).store_port, kDefaultStorePort);
  vars = {{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_JOB_ID", "42"}};
  EXPECT_EQ(parse_launch_env(env_of(vars)).store_port, 0);  // one rank: any free port
}

TEST(Bootstrap, TwoStepsOfOneJobServeTheirStoresAtDifferentPorts) {
  // srun ... & srun ... &: a job's steps may run at once on one node.
  Vars vars{{"SLURM_PROCID", "1"},
            {"SLURM_STEP_NUM_TASKS", "4"},
            {"SLURM_STEP_NUM_NODES", "1"},
            {"SLURM_JOB_ID", "123456"},
            {"SLURM_STEP_ID", "0"}};
  const std::uint16_t first = parse_launch_env(env_of(vars)).store_port;
  vars["SLURM_STEP_ID"] = "1";
  const std::uint16_t second = parse_launch_env(env_of(vars)).store_port;
  EXPECT_NE(first, second);
  EXPECT_EQ(first, slurm_step_port(123456, 0));
  EXPECT_EQ(second, slurm_step_port(123456, 1));
  // Every task of a step finds the same port without a word exchanged.
  vars["SLURM_PROCID"] = "3";
  EXPECT_EQ(parse_launch_env(env_of(vars)).store_port, second);
  // Whatever the ids, below Linux's ephemeral ports (32768-60999).
  for (const char* job : {"0", "1", "9999", "10000", "123456", "4294967295"}) {
    for (const char* step : {"0", "1", "2", "4294967294"}) {
      vars["SLURM_JOB_ID"] = job;
      vars["SLURM_STEP_ID"] = step;
      const std::uint16_t port = parse_launch_env(env_of(vars)).store_port;
      EXPECT_GE(port, 20000) << job << "." << step;
      EXPECT_LE(port, 29999) << job << "." << step;
    }
  }
}

TEST(Bootstrap, SlurmAcrossNodesWithoutJobIdOrNodeListIsAnError) {
  Vars vars{{"SLURM_PROCID", "0"},
            {"SLURM_STEP_NUM_TASKS", "4"},
            {"SLURM_NNODES", "2"},
            {"SLURM_JOB_NODELIST", "n[1-2]"}};
  EXPECT_THAT(error_for(vars),
              HasSubstr("the slurm environment spans 2 nodes but names no store: set "
                        "BRAID_STORE=host:port"));
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_JOB_ID and SLURM_STEP_NODELIST would place it"));
  EXPECT_FALSE(slurm_store_address(env_of(vars)));
  vars.erase("SLURM_JOB_NODELIST");
  vars["SLURM_JOB_ID"] = "5";
  EXPECT_THAT(error_for(vars), HasSubstr("spans 2 nodes but names no store"));
  EXPECT_FALSE(slurm_store_address(env_of(vars)));
}

TEST(Bootstrap, MalformedSlurmJobAndStepIdsAndNodeListsAreErrors) {
  Vars vars{{"SLURM_PROCID", "0"},
            {"SLURM_STEP_NUM_TASKS", "4"},
            {"SLURM_NNODES", "2"},
            {"SLURM_JOB_NODELIST", "n[1-2]"}};
  vars["SLURM_JOB_ID"] = "x";
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_JOB_ID='x' is not an integer"));
  vars["SLURM_JOB_ID"] = "-3";
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_JOB_ID=-3 must not be negative"));
  vars["SLURM_JOB_ID"] = "3";
  vars["SLURM_STEP_ID"] = "y";
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_STEP_ID='y' is not an integer"));
  vars["SLURM_STEP_ID"] = "-1";
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_STEP_ID=-1 must not be negative"));
  vars["SLURM_STEP_ID"] = "0";
  EXPECT_NO_THROW(parse_launch_env(env_of(vars)));
  // Checked even where BRAID_STORE makes the list unnecessary: Slurm wrote it, so it holds.
  vars["BRAID_STORE"] = "h:1";
  vars["SLURM_JOB_NODELIST"] = "n[2-1]";
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_JOB_NODELIST='n[2-1]' is not a Slurm host list"));
  vars["SLURM_STEP_NODELIST"] = "n[1-";
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_STEP_NODELIST='n[1-' is not a Slurm host list"));
  // And so are the ids.
  vars.erase("SLURM_STEP_NODELIST");
  vars["SLURM_JOB_NODELIST"] = "n[1-2]";
  vars["SLURM_STEP_ID"] = "y";
  EXPECT_THAT(error_for(vars), HasSubstr("SLURM_STEP_ID='y' is not an integer"));
}

TEST(Bootstrap, SlurmVariablesThatDisagreeAreErrorsNamingBoth) {
  const Vars consistent{
      {"SLURM_PROCID", "3"}, {"SLURM_STEP_NUM_TASKS", "4"},     {"SLURM_NODEID", "1"},
      {"SLURM_NNODES", "2"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_JOB_NODELIST", "n[1-2]"},
      {"BRAID_STORE", "h:1"}};
  EXPECT_NO_THROW(parse_launch_env(env_of(consistent)));
  const std::vector<std::pair<Vars, std::string>> cases{
      {{{"SLURM_STEP_NUM_TASKS", "5"}},
       "the Slurm variables disagree: SLURM_STEP_NUM_TASKS=5 but SLURM_TASKS_PER_NODE='2(x2)' "
       "adds up to 4 tasks"},
      {{{"SLURM_STEP_TASKS_PER_NODE", "3(x2)"}},
       "SLURM_STEP_NUM_TASKS=4 but SLURM_STEP_TASKS_PER_NODE='3(x2)' adds up to 6 tasks"},
      {{{"SLURM_NNODES", "3"}},
       "the Slurm variables disagree: SLURM_NNODES=3 but SLURM_TASKS_PER_NODE='2(x2)' lists 2 "
       "node(s)"},
      {{{"SLURM_JOB_NODELIST", "n[1-3]"}},
       "the Slurm variables disagree: SLURM_NNODES=2 but SLURM_JOB_NODELIST='n[1-3]' names 3 "
       "host(s)"},
      {{{"SLURM_STEP_NODELIST", "n1"}, {"SLURM_NODEID", "0"}, {"SLURM_PROCID", "1"}},
       "SLURM_NNODES=2 but SLURM_STEP_NODELIST='n1' names 1 host(s)"},
      {{{"SLURM_TASKS_PER_NODE", "1(x1000000000)"}},
       "SLURM_STEP_NUM_TASKS=4 but SLURM_TASKS_PER_NODE='1(x1000000000)' adds up to 1000000000 "
       "tasks"},
      {{{"SLURM_TASKS_PER_NODE", "2000000000(x2000000000)"}},
       "adds up to more than 2147483647 tasks"},
  };
  for (const auto& [changes, message] : cases) {
    Vars vars = consistent;
    for (const auto& [name, value] : changes) vars[name] = value;
    EXPECT_THAT(error_for(vars), HasSubstr(message)) << message;
  }
  // Without a task list, the node list alone bounds SLURM_NODEID.
  Vars vars = consistent;
  vars.erase("SLURM_TASKS_PER_NODE");
  vars.erase("SLURM_NNODES");
  vars["SLURM_NODEID"] = "2";
  EXPECT_THAT(error_for(vars),
              HasSubstr("SLURM_NODEID=2 is beyond the 2 host(s) of SLURM_JOB_NODELIST='n[1-2]'"));
}

TEST(Bootstrap, TorchrunInsideAnSrunStepOfOneTaskPerNodeAgreesWithIt) {
  // srun -N 2 --ntasks-per-node 1 torchrun --nnodes 2 --nproc-per-node 2: Slurm started
  // this node's torchrun, and torchrun the two ranks on it.
  Vars vars{{"RANK", "3"},
            {"WORLD_SIZE", "4"},
            {"LOCAL_RANK", "1"},
            {"LOCAL_WORLD_SIZE", "2"},
            {"GROUP_RANK", "1"},
            {"GROUP_WORLD_SIZE", "2"},
            {"MASTER_ADDR", "n1"},
            {"MASTER_PORT", "29500"},
            {"TORCHELASTIC_USE_AGENT_STORE", "True"},
            {"SLURM_PROCID", "1"},
            {"SLURM_LOCALID", "0"},
            {"SLURM_NODEID", "1"},
            {"SLURM_STEP_NUM_TASKS", "2"},
            {"SLURM_STEP_NUM_NODES", "2"},
            {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
            {"SLURM_STEP_NODELIST", "n[1-2]"},
            {"SLURM_JOB_ID", "77"},
            {"SLURM_STEP_ID", "0"}};
  auto info = parse_launch_env(env_of(vars));
  EXPECT_EQ(info.source, "torchrun");
  expect_ranks(info, 3, 4, 1, 2, 1, 2);
  ASSERT_EQ(info.outranked.size(), 1u);
  EXPECT_EQ(info.outranked[0].source, "slurm");
  EXPECT_EQ(info.outranked[0].verdict, OutrankedLaunch::Verdict::agrees);
  EXPECT_FALSE(outranked_disagree(info));
  EXPECT_EQ(info.outranked[0].description,
            "rank 1 of 2 (SLURM_PROCID=1, SLURM_STEP_NUM_TASKS=2), local rank 0 of 1 "
            "(SLURM_LOCALID=0, the 1 task(s) SLURM_STEP_TASKS_PER_NODE='1(x2)' gives node 1), "
            "node 1 of 2 (SLURM_NODEID=1, SLURM_STEP_NUM_NODES=2) (one per node: it started "
            "this node's launcher)");

  // One task per node, but torchrun numbered this node differently: not the same node.
  vars["GROUP_RANK"] = "0";
  vars["RANK"] = "1";
  info = parse_launch_env(env_of(vars));
  ASSERT_EQ(info.outranked.size(), 1u);
  EXPECT_EQ(info.outranked[0].verdict, OutrankedLaunch::Verdict::disagrees);

  // srun --ntasks-per-node 2 started two torchruns on each node: twice the processes
  // torchrun counts.
  vars["GROUP_RANK"] = "1";
  vars["RANK"] = "3";
  vars["SLURM_PROCID"] = "2";
  vars["SLURM_STEP_NUM_TASKS"] = "4";
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  info = parse_launch_env(env_of(vars));
  ASSERT_EQ(info.outranked.size(), 1u);
  EXPECT_EQ(info.outranked[0].verdict, OutrankedLaunch::Verdict::disagrees);
  EXPECT_TRUE(outranked_disagree(info));
  EXPECT_THAT(describe(info),
              HasSubstr("; slurm also present and disagrees: rank 2 of 4 (SLURM_PROCID=2, "
                        "SLURM_STEP_NUM_TASKS=4), local rank 0 of 2"));
  EXPECT_THAT(info.outranked[0].description, Not(HasSubstr("one per node")));
}

TEST(Bootstrap, ParseSlurmStepReadsTheStepWhateverElseIsSet) {
  // braid-run started once per node by srun takes its node from the step, not from the
  // BRAID_* or torchrun variables an enclosing launcher left behind.
  Vars vars{{"SLURM_PROCID", "1"},
            {"SLURM_LOCALID", "0"},
            {"SLURM_NODEID", "1"},
            {"SLURM_STEP_NUM_TASKS", "2"},
            {"SLURM_STEP_NUM_NODES", "2"},
            {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
            {"SLURM_STEP_NODELIST", "gpu[07-08]"},
            {"SLURM_JOB_ID", "9001"},
            {"SLURM_STEP_ID", "3"},
            {"BRAID_RANK", "5"},
            {"BRAID_WORLD_SIZE", "8"},
            {"RANK", "6"},
            {"WORLD_SIZE", "16"},
            {"LOCAL_RANK", "2"},
            {"LOCAL_WORLD_SIZE", "4"}};
  EXPECT_EQ(parse_launch_env(env_of(vars)).source, "braid");
  auto step = parse_slurm_step(env_of(vars));
  ASSERT_TRUE(step);
  EXPECT_EQ(step->source, "slurm");
  expect_ranks(*step, 1, 2, 0, 1, 1, 2);
  EXPECT_EQ(step->store_host, "gpu07");
  EXPECT_EQ(step->store_port, slurm_step_port(9001, 3));
  EXPECT_TRUE(step->outranked.empty());
  EXPECT_THAT(step->description,
              HasSubstr("slurm: rank 1 of 2 (SLURM_PROCID=1, SLURM_STEP_NUM_TASKS=2)"));

  // The store follows parse_launch_env's rules: one set by hand still comes first.
  vars["BRAID_STORE"] = "head:29600";
  step = parse_slurm_step(env_of(vars));
  ASSERT_TRUE(step);
  EXPECT_EQ(step->store_host, "head");
  EXPECT_EQ(step->store_port, 29600);

  // A step that cannot be read is an error here, where parse_launch_env only reports it.
  vars["SLURM_STEP_TASKS_PER_NODE"] = "x";
  EXPECT_THROW(parse_slurm_step(env_of(vars)), Error);
  EXPECT_EQ(parse_launch_env(env_of(vars)).outranked.back().verdict,
            OutrankedLaunch::Verdict::unreadable);

  // Outside a step (an sbatch script, an salloc shell), nothing, whatever else is set.
  vars["SLURM_STEP_TASKS_PER_NODE"] = "1(x2)";
  vars.erase("SLURM_STEP_NUM_TASKS");
  EXPECT_FALSE(parse_slurm_step(env_of(vars)));
  vars["SLURM_STEP_NUM_TASKS"] = "";
  EXPECT_FALSE(parse_slurm_step(env_of(vars)));
}

}  // namespace
}  // namespace braid::transport
