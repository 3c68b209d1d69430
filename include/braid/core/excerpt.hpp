// excerpt: what an error message quotes of a user's input. Errors name the argument, file
// or cell that is wrong and show it, but a 20 MB CSV cell or a binary file read as text must
// not come back whole: past `limit` bytes the quote is cut and says how long the text was,
// and bytes that are not printable ASCII show as '?', so the message stays one readable line.
//
//   throw Error(Errc::invalid_argument, fmt::format("'{}' is not a size", excerpt(text)));
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace braid {

inline constexpr std::size_t kExcerptBytes = 48;

std::string excerpt(std::string_view text, std::size_t limit = kExcerptBytes);

}  // namespace braid
