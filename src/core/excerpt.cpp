#include <fmt/format.h>

#include <braid/core/excerpt.hpp>

namespace braid {

std::string excerpt(std::string_view text, std::size_t limit) {
  const std::string_view shown = text.substr(0, limit);
  std::string out;
  out.reserve(shown.size() + 32);
  for (const char c : shown) out += c >= 0x20 && c < 0x7f ? c : '?';
  if (shown.size() < text.size()) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

}  // namespace braid
