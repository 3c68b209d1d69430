#include "transport/ptrace_permission.hpp"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <string>
#include <sys/prctl.h>
#include <unistd.h>

#include <braid/core/log.hpp>

namespace braid::transport::detail {

std::optional<pid_t> ptracer_to_declare(std::optional<std::string_view> yama_scope, pid_t parent) {
  if (!yama_scope || parent <= 1) return std::nullopt;  // no Yama; orphaned (init adopted us)
  int scope = -1;                                       // the file holds the number and a newline
  std::from_chars(yama_scope->data(), yama_scope->data() + yama_scope->size(), scope);
  if (scope != 1) return std::nullopt;
  return parent;
}

std::optional<pid_t> let_siblings_attach() {
  std::optional<std::string> scope;
  if (std::ifstream file("/proc/sys/kernel/yama/ptrace_scope"); file) {
    std::getline(file, scope.emplace());
  }
  const std::optional<pid_t> ptracer = ptracer_to_declare(scope, getppid());
  if (!ptracer) return std::nullopt;
  if (prctl(PR_SET_PTRACER, static_cast<unsigned long>(*ptracer), 0, 0, 0) != 0) {
    log::debug(
        "Yama ptrace_scope 1, and PR_SET_PTRACER {} failed ({}): ranks on this node "
        "copy through shared memory instead of reading each other's buffers",
        *ptracer, std::strerror(errno));
    return std::nullopt;
  }
  log::debug(
      "Yama ptrace_scope 1: processes under pid {} (this rank's launcher) may read "
      "this rank's memory",
      *ptracer);
  return ptracer;
}

}  // namespace braid::transport::detail
