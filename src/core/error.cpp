#include <fmt/format.h>

#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>

namespace braid {
namespace {

class BraidCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "braid"; }
  std::string message(int value) const override {
    switch (static_cast<Errc>(value)) {
      case Errc::timeout:
        return "timed out";
      case Errc::peer_failed:
        return "peer failed";
      case Errc::size_mismatch:
        return "size mismatch";
      case Errc::invalid_argument:
        return "invalid argument";
      case Errc::invalid_environment:
        return "invalid environment";
      case Errc::protocol_error:
        return "protocol error";
      case Errc::refused:
        return "refused";
      case Errc::closed:
        return "closed";
      case Errc::cancelled:
        return "cancelled";
      case Errc::desync:
        return "collective desync";
    }
    return fmt::format("unknown braid error {}", value);
  }
};

}  // namespace

const std::error_category& braid_category() noexcept {
  static const BraidCategory category;
  return category;
}

std::error_code make_error_code(Errc e) noexcept {
  return {static_cast<int>(e), braid_category()};
}

std::string format_error_message(const std::error_code& code, const std::string& detail,
                                 const ErrorContext& context) {
  std::string out;
  if (context.rank >= 0) out += fmt::format("rank {}: ", context.rank);
  std::string where = context.operation;
  std::string extra;
  if (context.peer >= 0) extra = fmt::format("peer rank {}", context.peer);
  if (context.sequence)
    extra += fmt::format("{}seq {}", extra.empty() ? "" : ", ", *context.sequence);
  if (!extra.empty()) where += (where.empty() ? "(" : " (") + extra + ")";
  if (!where.empty()) out += where + ": ";
  out += code.message();
  if (!detail.empty()) out += ": " + detail;
  if (&code.category() != &braid_category()) {
    out += fmt::format(" [{}:{}]", code.category().name(), code.value());
  }
  return out;
}

Error::Error(std::error_code code, std::string detail, ErrorContext context)
    : std::runtime_error(format_error_message(code, detail, context)),
      code_(code),
      detail_(std::move(detail)),
      context_(std::move(context)) {}

namespace detail {
void throw_invariant_error(const char* condition, const char* file, int line,
                           const std::string& message) {
  throw InvariantError(
      fmt::format("{}:{}: invariant '{}' failed: {}", file, line, condition, message));
}
}  // namespace detail

}  // namespace braid
