// A mode's command line, declared once: a table of options, each bound to a field of the
// mode's settings, from which both its parser and its lines of the usage text are made.
// A value that is not what the option takes is a std::invalid_argument naming the option,
// the limits and the value (braid-bench prints it as one line and exits 2).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace braid::bench {

struct Option {
  std::string name;   // "--ranks"
  std::string shown;  // the default, as the usage text shows it ("2,4", "64M")
  std::string note;   // in brackets after it in the usage text
  std::function<void(const std::string&)> take;  // parses a value into the field
  std::function<std::string()> text;             // the field's value, as the option takes it
  bool flag = false;                             // takes no value: present sets it
  bool internal = false;  // between braid-bench and its own ranks (--worker): not shown

  Option&& noted(std::string why) && {
    note = std::move(why);
    return std::move(*this);
  }
  Option&& unlisted() && {
    internal = true;
    return std::move(*this);
  }
};
using OptionTable = std::vector<Option>;

Option flag(std::string name, bool& field);
// A whole number from `least` to `most`.
Option count(std::string name, int& field, int least, int most = 100000);
// A comma-separated list of whole numbers ("--ranks 2,4"), at least one.
Option counts(std::string name, std::vector<int>& field, int least, int most);
Option decimal(std::string name, double& field, double least, double most);
// A byte size ("64K", "4M"; byte_size.hpp); least 1 unless given.
Option bytes(std::string name, std::size_t& field, std::size_t least = 1);
// A comma-separated list of byte sizes, at least one.
Option byte_sizes(std::string name, std::vector<std::size_t>& field);
// One of `allowed`; any text where `allowed` is empty.
Option word(std::string name, std::string& field, std::vector<std::string> allowed = {});
// A comma-separated list of `allowed` names (any where empty), at least one.
Option words(std::string name, std::vector<std::string>& field,
             std::vector<std::string> allowed = {});

// Sets the table's fields from `args`; throws std::invalid_argument for an unknown option, a
// missing value or a value the option does not take.
void parse_options(const OptionTable& table, const std::vector<std::string>& args);

// The options' part of the usage text: "--name default (note)" for each option shown,
// wrapped at 100 columns, each line indented by `indent`.
std::string usage_of(const OptionTable& table, std::size_t indent);

// `head` padded to `indent` columns, then `words` wrapped at 100 columns, each further line
// indented by `indent`.
std::string wrap(const std::string& head, std::string_view words, std::size_t indent);

// The named options with their fields' values, as a program that takes the same options
// (a worker, a peer) is given them: {"--hidden", "256", "--json", ...}; a flag only when set.
std::vector<std::string> arguments(const OptionTable& table,
                                   const std::vector<std::string_view>& names);
// Every option of the table, likewise.
std::vector<std::string> arguments(const OptionTable& table);

// A whole number from `least` to `most`; anything else (a sign, a suffix, an overflow) is a
// std::invalid_argument naming the option.
int whole_number(const std::string& option, const std::string& text, int least, int most);

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> split_list(const std::string& text);

}  // namespace braid::bench
