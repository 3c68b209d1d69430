#include "options.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "byte_size.hpp"

namespace braid::bench {
namespace {

// "64M" for 64 MiB: a size as the usage text shows it.
std::string shown_bytes(std::size_t bytes) {
  for (const auto& [shift, unit] : {std::pair{30, "G"}, {20, "M"}, {10, "K"}}) {
    if (bytes >= (std::size_t{1} << shift) && bytes % (std::size_t{1} << shift) == 0) {
      return fmt::format("{}{}", bytes >> shift, unit);
    }
  }
  return std::to_string(bytes);
}

void check_allowed(const std::string& option, const std::string& value,
                   const std::vector<std::string>& allowed) {
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
    throw std::invalid_argument(
        fmt::format("{} takes {}, not '{}'", option, fmt::join(allowed, ","), value));
  }
}

// Each item of the list `text` through `one`; an empty list is refused.
template <class Item>
std::vector<Item> list_of(const std::string& option, const std::string& text, auto&& one) {
  std::vector<Item> items;
  for (const std::string& item : split_list(text)) items.push_back(one(item));
  if (items.empty()) throw std::invalid_argument(option + " needs at least one item");
  return items;
}

Option option(std::string name, auto& field, auto&& take, auto&& text) {
  Option o{.name = std::move(name),
           .take = [&field, take](const std::string& value) { field = take(value); },
           .text = [&field, text] { return text(field); }};
  o.shown = o.text();
  return o;
}

}  // namespace

int whole_number(const std::string& option, const std::string& text, int least, int most) {
  long long value = 0;
  std::size_t used = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < least || value > most) {
    throw std::invalid_argument(
        fmt::format("{} needs a whole number from {} to {}, not '{}'", option, least, most, text));
  }
  return static_cast<int>(value);
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

Option flag(std::string name, bool& field) {
  Option o = option(
      std::move(name), field, [](const std::string&) { return true; },
      [](bool on) { return on ? std::string("1") : std::string(); });
  o.flag = true;
  return o;
}

Option count(std::string name, int& field, int least, int most) {
  return option(
      name, field, [=](const std::string& v) { return whole_number(name, v, least, most); },
      [](int value) { return std::to_string(value); });
}

Option counts(std::string name, std::vector<int>& field, int least, int most) {
  return option(
      name, field,
      [=](const std::string& v) {
        return list_of<int>(name, v, [&](const std::string& item) {
          return whole_number(name, item, least, most);
        });
      },
      [](const std::vector<int>& values) { return fmt::format("{}", fmt::join(values, ",")); });
}

Option decimal(std::string name, double& field, double least, double most) {
  return option(
      name, field,
      [=](const std::string& text) {
        double value = 0;
        std::size_t used = 0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size() || !(value >= least && value <= most)) {
          throw std::invalid_argument(fmt::format("{} needs a number from {:g} to {:g}, not '{}'",
                                                  name, least, most, text));
        }
        return value;
      },
      [](double value) { return fmt::format("{}", value); });
}

Option bytes(std::string name, std::size_t& field, std::size_t least) {
  Option o = option(
      name, field,
      [=](const std::string& v) {
        const std::size_t value = parse_bytes(v);
        if (value < least) {
          throw std::invalid_argument(fmt::format("{} must be at least {} bytes", name, least));
        }
        return value;
      },
      [](std::size_t value) { return std::to_string(value); });
  o.shown = shown_bytes(field);
  return o;
}

Option byte_sizes(std::string name, std::vector<std::size_t>& field) {
  Option o = option(
      name, field,
      [=](const std::string& v) {
        return list_of<std::size_t>(name, v, [&](const std::string& item) {
          try {
            if (const std::size_t value = parse_bytes(item); value > 0) return value;
          } catch (const std::invalid_argument& e) {
            throw std::invalid_argument(name + ": " + e.what());
          }
          throw std::invalid_argument(name + ": a size must be at least 1 byte");
        });
      },
      [](const std::vector<std::size_t>& values) {
        return fmt::format("{}", fmt::join(values, ","));
      });
  std::vector<std::string> shown;
  for (const std::size_t value : field) shown.push_back(shown_bytes(value));
  o.shown = fmt::format("{}", fmt::join(shown, ","));
  return o;
}

Option word(std::string name, std::string& field, std::vector<std::string> allowed) {
  return option(
      name, field,
      [=](const std::string& v) {
        check_allowed(name, v, allowed);
        return v;
      },
      [](const std::string& value) { return value; });
}

Option words(std::string name, std::vector<std::string>& field, std::vector<std::string> allowed) {
  return option(
      name, field,
      [=](const std::string& v) {
        return list_of<std::string>(name, v, [&](const std::string& item) {
          check_allowed(name, item, allowed);
          return item;
        });
      },
      [](const std::vector<std::string>& values) {
        return fmt::format("{}", fmt::join(values, ","));
      });
}

void parse_options(const OptionTable& table, const std::vector<std::string>& args) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto option = std::find_if(table.begin(), table.end(),
                                     [&](const Option& o) { return o.name == args[i]; });
    if (option == table.end()) throw std::invalid_argument("unknown option " + args[i]);
    if (!option->flag && i + 1 >= args.size()) {
      throw std::invalid_argument(args[i] + " needs a value");
    }
    option->take(option->flag ? std::string() : args[++i]);
  }
}

std::string usage_of(const OptionTable& table, std::size_t indent) {
  if (std::all_of(table.begin(), table.end(), [](const Option& o) { return o.internal; }))
    return "";
  const std::string margin(indent, ' ');
  std::string text;
  std::string line = margin + "options:";
  for (const Option& o : table) {
    if (o.internal) continue;
    std::string item = o.name;
    if (!o.flag) item += " " + (o.shown.size() > 40 ? o.shown.substr(0, 37) + "..." : o.shown);
    if (!o.note.empty()) item += " (" + o.note + ")";
    if (line.size() + 1 + item.size() > 100) {
      text += line + "\n";
      line = margin + "        ";
    }
    line += " " + item;
  }
  return text + line + "\n";
}

std::string wrap(const std::string& head, std::string_view words, std::size_t indent) {
  std::string text;
  std::string line = head + std::string(head.size() < indent ? indent - head.size() : 1, ' ');
  std::istringstream stream{std::string(words)};
  bool first = true;
  for (std::string word; stream >> word; first = false) {
    if (!first && line.size() + 1 + word.size() > 100) {
      text += line + "\n";
      line = std::string(indent, ' ');
    } else if (!first) {
      line += " ";
    }
    line += word;
  }
  return text + line + "\n";
}

std::vector<std::string> arguments(const OptionTable& table,
                                   const std::vector<std::string_view>& names) {
  std::vector<std::string> args;
  for (const std::string_view name : names) {
    const auto option =
        std::find_if(table.begin(), table.end(), [&](const Option& o) { return o.name == name; });
    if (option == table.end())
      throw std::logic_error("braid-bench: no option " + std::string(name));
    const std::string value = option->text();
    if (option->flag && value.empty()) continue;
    args.push_back(option->name);
    if (!option->flag) args.push_back(value);
  }
  return args;
}

std::vector<std::string> arguments(const OptionTable& table) {
  std::vector<std::string_view> names;
  for (const Option& o : table) names.push_back(o.name);
  return arguments(table, names);
}

}  // namespace braid::bench
