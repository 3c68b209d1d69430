// A rank in another process, for the killed-peer test (ucx_test.cpp): reads rank 0's
// UCX address (hex) from stdin, prints its own on stdout, connects as rank 1, sends rank
// 0 one 8-byte message (sequence 0) to prove the connection works, then waits to be killed.
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <braid/core/runtime.hpp>
#include <braid/transport/ucx/ucx_worker.hpp>

namespace {

using braid::transport::Bytes;

Bytes from_hex(const std::string& hex) {
  Bytes out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<std::uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

}  // namespace

int main() {
  try {
    std::string parent_hex;
    if (!std::getline(std::cin, parent_hex)) return 2;
    braid::Runtime runtime({.rank = 1});
    braid::transport::UcxWorker worker(runtime);
    fmt::print("{:02x}\n", fmt::join(worker.address(), ""));
    std::fflush(stdout);
    worker.connect({from_hex(parent_hex), worker.address()}, 1);
    std::uint64_t hello = 42;
    runtime
        .spawn(worker.send(0, braid::Buffer(&hello, 1, braid::DType::i64), {.sequence = 0},
                           braid::deadline_after(std::chrono::seconds(10))))
        .get();
    for (;;) pause();
  } catch (const std::exception& e) {
    fmt::print(stderr, "ucx_test_peer: {}\n", e.what());
    return 1;
  }
}
