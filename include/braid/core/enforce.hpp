// Broken invariants: conditions that only fail when braid or its caller has a bug.
// BRAID_ENFORCE(cond, "format {}", args...) throws braid::InvariantError with the
// condition's text, file and line. It is always on (not compiled out in release
// builds): these checks sit at API boundaries, never in inner loops.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace braid {

class InvariantError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {
[[noreturn]] void throw_invariant_error(const char* condition, const char* file, int line,
                                        const std::string& message);
}  // namespace detail

}  // namespace braid

#define BRAID_ENFORCE(condition, ...)                                        \
  do {                                                                       \
    if (!(condition)) [[unlikely]] {                                         \
      ::braid::detail::throw_invariant_error(#condition, __FILE__, __LINE__, \
                                             ::fmt::format(__VA_ARGS__));    \
    }                                                                        \
  } while (false)
