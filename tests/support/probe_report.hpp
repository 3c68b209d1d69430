// How the process tests' probes (tests/torch/*_probe.cpp) report a training loop that a
// killed rank interrupts: what the tests read from each survivor's stderr and exit code.
#pragma once

#include <exception>
#include <iostream>

namespace braid::testing {

// Runs `train`, a loop that only returns if no failure stopped it. Throwing: prints "rank R
// saw: <what>" and returns 3. Returning: prints that training went on and returns 1.
template <class Train>
int report_training(int rank, Train&& train) {
  try {
    train();
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << " saw: " << e.what() << "\n";
    return 3;
  }
  std::cerr << "rank " << rank << ": training went on after a rank was killed\n";
  return 1;
}

}  // namespace braid::testing
