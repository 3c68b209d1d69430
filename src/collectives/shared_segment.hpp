// SharedSegment: a POSIX shared-memory segment mapped into this process, owned (unmapped
// on destruction). One process creates it under a fresh name; the others open that name;
// the creator removes the name once every process has it mapped, so a crash never leaves
// it behind in /dev/shm.
//
// Its pages are reserved when it is created (posix_fallocate): a /dev/shm too small for
// it fails here, with ENOSPC, instead of killing a process with SIGBUS at its first write
// to a page the filesystem cannot back.
#pragma once

#include <cstddef>
#include <string>

namespace braid::collectives::detail {

class SharedSegment {
 public:
  SharedSegment() = default;
  ~SharedSegment();
  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  // Creates `bytes` under a fresh name and maps them, zeroed. An Error (naming the
  // segment, with the errno) if any step fails.
  static SharedSegment create(std::size_t bytes);
  // Maps the `bytes` another process created under `name`.
  static SharedSegment open(const std::string& name, std::size_t bytes);

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }
  explicit operator bool() const noexcept { return data_ != nullptr; }
  // The creator's name for it; empty once removed (and in the processes that opened it).
  const std::string& name() const noexcept { return name_; }
  // The creator, once every process has mapped it: removes the name; the mappings stay.
  void unlink_name() noexcept;

 private:
  void release() noexcept;

  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::string name_;
};

}  // namespace braid::collectives::detail
