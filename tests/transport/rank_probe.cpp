// A rank for launcher_test: runs its arguments as a little script, in order.
//   env                 print what parse_launch_env() reads, as key=value pairs
//   out TEXT / err TEXT print a line on stdout / stderr
//   partial TEXT        print TEXT on stdout without a newline
//   ready               print "ready pid=<pid>"
//   sleep SECONDS       sleep (SIGTERM ends it, unless ignore-term came first)
//   exit CODE           exit with CODE
//   kill                SIGKILL itself
//   ignore-term         ignore SIGTERM from here on
//   touch PATH          create the file PATH
//   wait-for PATH       wait until the file PATH exists (ranks order themselves this way)
//   on R COMMAND...     run COMMAND only on rank R
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>

#include <braid/transport/bootstrap.hpp>

int main(int argc, char** argv) {
  auto launch = braid::transport::parse_launch_env();
  auto next = [&](int& i) -> std::string {
    if (i + 1 >= argc) {
      fmt::print(stderr, "rank_probe: {} needs an argument\n", argv[i]);
      std::exit(64);
    }
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string command = argv[i];
    if (command == "on") {
      if (std::stoi(next(i)) != launch.rank) {
        // Skip the command and its arguments.
        std::string skipped = next(i);
        if (skipped == "out" || skipped == "err" || skipped == "partial" || skipped == "sleep" ||
            skipped == "exit" || skipped == "touch" || skipped == "wait-for") {
          next(i);
        }
      }
    } else if (command == "env") {
      const char* omp_threads = std::getenv("OMP_NUM_THREADS");
      fmt::print(
          "rank={} world={} local_rank={} local_world={} node={} nodes={} store={} "
          "token={} source={} omp_threads={}\n",
          launch.rank, launch.world_size, launch.local_rank, launch.local_world_size,
          launch.node_rank, launch.num_nodes,
          braid::transport::format_host_port(launch.store_host, launch.store_port), launch.token,
          launch.source, omp_threads != nullptr ? omp_threads : "unset");
    } else if (command == "out") {
      fmt::print("{}\n", next(i));
    } else if (command == "err") {
      fmt::print(stderr, "{}\n", next(i));
    } else if (command == "partial") {
      fmt::print("{}", next(i));
    } else if (command == "ready") {
      fmt::print("ready pid={}\n", ::getpid());
    } else if (command == "sleep") {
      std::this_thread::sleep_for(std::chrono::duration<double>(std::stod(next(i))));
    } else if (command == "exit") {
      return std::stoi(next(i));
    } else if (command == "kill") {
      std::raise(SIGKILL);
    } else if (command == "ignore-term") {
      std::signal(SIGTERM, SIG_IGN);
    } else if (command == "touch") {
      std::string path = next(i);
      FILE* file = std::fopen(path.c_str(), "w");
      if (file == nullptr) {
        fmt::print(stderr, "rank_probe: cannot create {}\n", path);
        return 65;
      }
      std::fclose(file);
    } else if (command == "wait-for") {
      std::string path = next(i);
      while (::access(path.c_str(), F_OK) != 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    } else {
      fmt::print(stderr, "rank_probe: unknown command '{}'\n", command);
      return 64;
    }
    std::fflush(stdout);
  }
  return 0;
}
