// Test machinery, kept out of the public header: a copy engine other than CUDA's for a
// communicator's staged calls. staging_test gives a host engine (HostCopyEngine), so the
// staged paths run end to end on buffers labelled CUDA memory that live on the host, on
// machines without a GPU.
#pragma once

#include <functional>
#include <memory>

#include <braid/collectives/communicator.hpp>

#include "collectives/staging.hpp"

namespace braid::collectives::detail {

struct StagingEngineOverride {
  // Makes the copy engine that stages CUDA buffers of a device.
  using Factory = std::function<std::unique_ptr<CopyEngine>(int device)>;

  // From now on `comm`, and the communicators split from it, stage CUDA buffers through
  // make(device) instead of CUDA's engine (a copy stream and pinned memory), and accept
  // CUDA buffers in builds without CUDA. Call it before `comm`'s first call.
  static void install(Communicator& comm, Factory make);
};

}  // namespace braid::collectives::detail
