// JSON text out, for the trace exporter, its summary and the pipeline simulator's timeline:
// strings escaped per RFC 8259, numbers without locale.
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace braid {

// Appends `text` as a quoted JSON string. Control characters become \u00XX; bytes >= 0x80
// pass through (names are UTF-8 already).
inline void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// Nanoseconds as the microseconds Chrome's trace format wants, with the nanoseconds kept
// (three decimals) and no exponent.
inline void append_microseconds(std::string& out, std::int64_t ns) {
  const char* sign = ns < 0 ? "-" : "";
  const std::uint64_t magnitude =
      ns < 0 ? static_cast<std::uint64_t>(-(ns + 1)) + 1 : static_cast<std::uint64_t>(ns);
  fmt::format_to(std::back_inserter(out), "{}{}.{:03}", sign, magnitude / 1000, magnitude % 1000);
}

}  // namespace braid
