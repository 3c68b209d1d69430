// Durations as the store's messages print them ("within 0.300s"): one helper for braid's
// own client and the etcd one.
#pragma once

#include <chrono>

#include <braid/core/deadline.hpp>

namespace braid::transport {

inline double seconds(Clock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

}  // namespace braid::transport
