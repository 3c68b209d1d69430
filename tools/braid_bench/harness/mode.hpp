// A braid-bench mode, described: its name, what it measures, its options table and how it
// runs. A new mode is a settings struct with its defaults and one of these filled in; main()
// takes the usage text and the parser from it.
//
//   Mode tp_mode() {
//     return describe<TpSettings>({.name = "tp", .about = "...", .options = options,
//                                  .run = run});
//   }
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "options.hpp"

namespace braid::bench {

template <class Settings>
struct ModeDescription {
  std::string_view name;
  std::string_view about;  // what it measures: the usage text's words beside the name
  OptionTable (*options)(Settings&) = nullptr;  // binds the table to a settings object
  // Checks what the table cannot (options that depend on each other: a std::invalid_argument
  // before anything runs), then runs; returns the exit code.
  int (*run)(Settings&) = nullptr;
};

struct Mode {
  std::string name;
  std::function<std::string()> usage;                       // the mode's part of --help
  std::function<int(const std::vector<std::string>&)> run;  // parses its arguments and runs
};

template <class Settings>
Mode describe(const ModeDescription<Settings>& mode) {
  return Mode{.name = std::string(mode.name),
              .usage =
                  [mode] {
                    Settings defaults;
                    return wrap("  " + std::string(mode.name), mode.about, 15) +
                           usage_of(mode.options(defaults), 8);
                  },
              .run =
                  [mode](const std::vector<std::string>& args) {
                    Settings settings;
                    parse_options(mode.options(settings), args);
                    return mode.run(settings);
                  }};
}

}  // namespace braid::bench
