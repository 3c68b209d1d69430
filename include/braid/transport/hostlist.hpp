// Slurm host lists: the compressed node names Slurm writes into SLURM_JOB_NODELIST and
// SLURM_STEP_NODELIST, expanded as `scontrol show hostnames` does.
//
//   "a,b,c"             a b c
//   "node[01-04,07]"    node01 node02 node03 node04 node07   (a range's width is its low
//                                                             bound's: n[1-03] is n1 n2 n3)
//   "rack[1-2]-n[1-2]"  rack1-n1 rack1-n2 rack2-n1 rack2-n2  (every bracket group of a name
//                                                             multiplies, the last fastest)
//   "a[1-3],b[5,7],c"   a1 a2 a3 b5 b7 c                     (commas outside brackets
//                                                             separate names)
//
// Stricter than Slurm's own parser, which shrugs off some text it never writes (n[1-],
// a,,b, an unclosed bracket): an empty name, an unclosed or stray bracket, a bracket group
// inside another, a range that runs backwards or holds anything but digits, text after a
// name's last bracket group (Slurm refuses that too) and a blank inside a name all throw
// braid::Error(Errc::invalid_environment) naming `what` (the variable, e.g.
// SLURM_JOB_NODELIST) and the text. So does a list of more than kMostRanks hosts
// (bootstrap.hpp): no braid job spans more nodes than it has ranks, and n[0-999999999]
// must not allocate a billion strings.
//
// Cost: each call parses the whole text once, in time and memory linear in its length;
// first_host and count_hosts expand nothing, expand_hostlist allocates the hosts it returns.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace braid::transport {

// Every host `list` names, in Slurm's order, duplicates kept.
std::vector<std::string> expand_hostlist(std::string_view list, std::string_view what);

// expand_hostlist(list, what).front(), without expanding the rest.
std::string first_host(std::string_view list, std::string_view what);

// expand_hostlist(list, what).size(), without expanding anything.
std::int64_t count_hosts(std::string_view list, std::string_view what);

}  // namespace braid::transport
