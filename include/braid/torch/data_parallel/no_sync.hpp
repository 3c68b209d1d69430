// The scope of PyTorch's no_sync(), shared by DistributedDataParallel and
// FullyShardedDataParallel: while a NoSync lives, backward passes accumulate gradients
// locally without communicating; the first backward after it reduces what they summed.
#pragma once

#include <atomic>

namespace braid::torch {

class NoSync {
 public:
  // `require_sync` is the wrapper's switch: false for the scope, true again after it.
  explicit NoSync(std::atomic<bool>& require_sync) : require_sync_(require_sync) {
    require_sync_ = false;
  }
  ~NoSync() { require_sync_ = true; }
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;

 private:
  std::atomic<bool>& require_sync_;
};

}  // namespace braid::torch
