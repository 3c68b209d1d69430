// A user's program, built against an installed braid through pkg-config: it must find
// every header and library from braid.pc alone.
#include <iostream>

#include <braid/braid.hpp>

int main() {
  braid::Runtime runtime;
  auto world = braid::transport::World::join(runtime);
  std::int32_t value = 41;
  braid::Buffer buffer(&value, 1, braid::DType::i32);
  runtime
      .spawn([](braid::transport::World& w, braid::Buffer b) -> braid::asio::awaitable<void> {
        b.as<std::int32_t>()[0] += 1;
        co_await w.send(w.rank(), b, 1);  // to itself, through UCX
        co_await w.recv(w.rank(), b, 1);
      }(*world, buffer))
      .get();
  std::cout << "consumer: rank " << world->rank() << " of " << world->size() << " got " << value
            << "\n";
  return value == 42 ? 0 : 1;
}
