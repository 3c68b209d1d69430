// A rank whose behaviour world_test scripts with its first argument. It joins the World
// from the environment, like any braid program, then:
//   die-after-ready   rank 1 tells rank 0 it is ready and kills itself (SIGKILL); rank 0
//                     waits for a second message and prints the error it gets.
//   host-dies-after-ready  rank 1 tells rank 0 it is ready, then waits for a second
//                     message; rank 0, which serves the store, kills itself on hearing it.
//   fail-after-join   rank 1 exits with code 3; rank 0 waits for a message that never comes.
//   throw-after-join  rank 1 throws past its World (leaving through an error); rank 0 waits
//                     for a message that never comes.
//   join              joins and leaves.
// Errors are printed as "error: <what>" on stderr, with exit code 3. The World leaves with
// its default leave timeout, so a survivor that waited on a dead peer shows as a slow exit.
#include <csignal>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include <braid/braid.hpp>

namespace {

using braid::asio::awaitable;
using namespace std::chrono_literals;

awaitable<void> die_after_ready(braid::transport::World& world) {
  std::uint8_t byte = 1;
  braid::Buffer buffer(&byte, 1, braid::DType::u8);
  if (world.rank() == 1) {
    co_await world.send(0, buffer, 1);
    std::this_thread::sleep_for(100ms);  // let the message leave before dying
    std::raise(SIGKILL);
  }
  co_await world.recv(1, buffer, 1);
  co_await world.recv(1, buffer, 2, braid::deadline_after(60s));
}

// Here the survivor says it is ready: rank 0 serves the store on its runtime thread, so
// it must not die (or block that thread) before rank 1 has finished joining.
awaitable<void> host_dies_after_ready(braid::transport::World& world) {
  std::uint8_t byte = 1;
  braid::Buffer buffer(&byte, 1, braid::DType::u8);
  if (world.rank() == 0) {
    co_await world.recv(1, buffer, 1);
    std::raise(SIGKILL);
  }
  co_await world.send(0, buffer, 1);
  co_await world.recv(0, buffer, 2, braid::deadline_after(60s));
}

awaitable<void> wait_forever_on_rank_zero(braid::transport::World& world) {
  std::uint8_t byte = 0;
  braid::Buffer buffer(&byte, 1, braid::DType::u8);
  co_await world.recv(1, buffer, 1, braid::deadline_after(60s));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "join";
  try {
    braid::Runtime runtime;
    auto world = braid::transport::World::join(runtime);
    if (mode == "die-after-ready") {
      runtime.spawn(die_after_ready(*world)).get();
    } else if (mode == "host-dies-after-ready") {
      runtime.spawn(host_dies_after_ready(*world)).get();
    } else if (mode == "fail-after-join") {
      if (world->rank() == 1) std::_Exit(3);
      runtime.spawn(wait_forever_on_rank_zero(*world)).get();
    } else if (mode == "throw-after-join") {
      if (world->rank() == 1) throw std::runtime_error("rank 1 gave up");
      runtime.spawn(wait_forever_on_rank_zero(*world)).get();
    }
    std::cout << "rank " << world->rank() << " done\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 3;
  }
}
