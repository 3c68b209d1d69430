#include "collectives/shared_segment.hpp"

#include <cerrno>
#include <fcntl.h>
#include <random>
#include <sys/mman.h>
#include <unistd.h>
#include <utility>

#include <fmt/format.h>

#include <braid/core/error.hpp>

namespace braid::collectives::detail {
namespace {

[[noreturn]] void fail(int error, const std::string& what, const std::string& name,
                       std::size_t bytes) {
  throw Error(std::error_code(error, std::generic_category()),
              fmt::format("{} shared-memory segment {} ({} bytes)", what, name, bytes));
}

// Maps the segment behind `fd` and closes `fd`; null (errno set) if mmap failed.
std::byte* map(int fd, std::size_t bytes) {
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (memory == MAP_FAILED) {
    errno = error;
    return nullptr;
  }
  return static_cast<std::byte*>(memory);
}

}  // namespace

SharedSegment::~SharedSegment() {
  release();
}

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      name_(std::move(other.name_)) {
  other.name_.clear();
}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    name_ = std::move(other.name_);
    other.name_.clear();
  }
  return *this;
}

void SharedSegment::release() noexcept {
  if (data_ != nullptr) munmap(data_, bytes_);
  data_ = nullptr;
  unlink_name();
}

void SharedSegment::unlink_name() noexcept {
  if (!name_.empty()) shm_unlink(name_.c_str());
  name_.clear();
}

SharedSegment SharedSegment::create(std::size_t bytes) {
  std::random_device random;
  SharedSegment segment;
  segment.name_ = fmt::format("/braid-{}-{:08x}{:08x}", getpid(), random(), random());
  segment.bytes_ = bytes;
  const int fd = shm_open(segment.name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    const int error = errno;
    const std::string name = std::exchange(segment.name_, {});  // not ours to remove
    fail(error, "cannot create", name, bytes);
  }
  // posix_fallocate returns the error rather than setting errno. The segment's name is
  // removed by the destructor on every failure below.
  if (const int error = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); error != 0) {
    close(fd);
    fail(error, "cannot reserve", segment.name_, bytes);
  }
  segment.data_ = map(fd, bytes);
  if (segment.data_ == nullptr) fail(errno, "cannot map", segment.name_, bytes);
  return segment;  // fresh pages read as zero
}

SharedSegment SharedSegment::open(const std::string& name, std::size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) fail(errno, "cannot open", name, bytes);
  SharedSegment segment;
  segment.bytes_ = bytes;
  segment.data_ = map(fd, bytes);
  if (segment.data_ == nullptr) fail(errno, "cannot map", name, bytes);
  return segment;
}

}  // namespace braid::collectives::detail
