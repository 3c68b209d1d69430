// What every braid-bench worker's main() does around its body: records every collective
// in the trace (the workers sum exposed communication from them, so small calls must not
// be sampled), and turns errors into one line on stderr and an exit code: 2 for bad
// arguments (std::invalid_argument), 1 for anything else.
#pragma once

#include <cstdlib>
#include <exception>
#include <iostream>
#include <stdexcept>

namespace braid::bench {

template <class Body>
int worker_main(const char* name, Body&& body) {
  setenv("BRAID_TRACE_SAMPLE_KIB", "0", 1);
  try {
    return body();
  } catch (const std::invalid_argument& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace braid::bench
