// braid-bench algorithms: the collective algorithm selection table in force, BRAID_ALGO
// applied.
#include <iostream>

#include <braid/collectives/selection.hpp>

#include "modes.hpp"

namespace braid::bench {

Mode algorithms_mode() {
  struct NoSettings {};
  return describe<NoSettings>(
      {.name = "algorithms",
       .about = "the collective algorithm selection table in force (BRAID_ALGO applied)",
       .options = [](NoSettings&) { return OptionTable{}; },
       .run =
           [](NoSettings&) {
             std::cout << collectives::SelectionTable::from_environment().describe();
             return 0;
           }});
}

}  // namespace braid::bench
