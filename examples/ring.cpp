// Passes a token around a ring of ranks with co_await: rank 0 starts it, every rank adds
// its own number and hands it on, and rank 0 checks what comes back.
//
//   braid-run -n 4 build/examples/ring [laps]
//
// The shape of every braid program: a Runtime (the thread all communication runs on), a
// World joined from the launcher's environment, and coroutines spawned on the runtime.
#include <iostream>

#include <braid/braid.hpp>

#include "braid_models/whole_number.hpp"

namespace {

using braid::asio::awaitable;

// Each lap adds 0 + 1 + ... + (size - 1) to the token.
awaitable<std::int64_t> pass_token(braid::transport::World& world, int laps) {
  const int next = (world.rank() + 1) % world.size();
  const int prev = (world.rank() + world.size() - 1) % world.size();
  std::int64_t token = 0;
  braid::Buffer buffer(&token, 1, braid::DType::i64);
  if (world.size() == 1) co_return 0;
  // Every hop of lap L carries tag L; rank 0 receives lap L's token as it starts lap L + 1.
  for (int lap = 0; lap < laps; ++lap) {
    if (world.rank() != 0) {
      co_await world.recv(prev, buffer, lap);
    } else if (lap > 0) {
      co_await world.recv(prev, buffer, lap - 1);
    }
    token += world.rank();
    co_await world.send(next, buffer, lap);
  }
  if (world.rank() == 0) co_await world.recv(prev, buffer, laps - 1);
  co_return token;
}

}  // namespace

int main(int argc, char** argv) {
  int laps = 1;
  try {
    // A lap is a world message tag: far below 2^32.
    if (argc > 1) laps = example_models::whole_number("laps", argv[1], 1, 1'000'000);
  } catch (const std::invalid_argument& e) {
    std::cerr << "ring: " << e.what() << " (usage: ring [laps])\n";
    return 2;
  }
  try {
    braid::Runtime runtime;
    auto world = braid::transport::World::join(runtime);
    const std::int64_t token = runtime.spawn(pass_token(*world, laps)).get();
    if (world->rank() != 0) {
      std::cout << "rank " << world->rank() << " of " << world->size() << " passed the token on\n";
      return 0;
    }
    const std::int64_t expected =
        static_cast<std::int64_t>(laps) * world->size() * (world->size() - 1) / 2;
    std::cout << "rank 0: the token came back as " << token << " after " << laps << " lap(s) of "
              << world->size() << " rank(s); expected " << expected << "\n";
    return token == expected ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "ring: " << e.what() << "\n";
    return 1;
  }
}
