#include "shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/base/error.h"

namespace duet::shm {
namespace {

constexpr std::string_view kPrefix = "duet-";

std::string os_error(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

bool is_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

bool valid_what(std::string_view what) {
  if (what.empty() || what.size() > kMaxWhatLength) return false;
  return std::all_of(what.begin(), what.end(),
                     [](char c) { return is_alnum(c) || c == '_' || c == '.'; });
}

// A full segment name is "/" + a valid stack id + "-" + a valid what.
void validate_name(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() > 255) {
    throw Error(Errc::invalid_argument,
                "shm segment name '" + name + "' must be '/' then up to 254 characters, no '/'");
  }
}

// The stack's segment file names in /dev/shm (without the leading '/').
std::vector<std::string> stack_files(std::string_view stack_id) {
  validate_stack_id(stack_id);
  std::string prefix = std::string(kPrefix) + std::string(stack_id) + "-";
  std::vector<std::string> out;
  DIR* dir = opendir(kShmDir);
  if (dir == nullptr) {
    throw Error(Errc::io, os_error(std::string("cannot list ") + kShmDir, errno));
  }
  while (dirent* entry = readdir(dir)) {
    std::string_view file = entry->d_name;
    if (file.size() > prefix.size() && file.substr(0, prefix.size()) == prefix &&
        valid_what(file.substr(prefix.size()))) {
      out.emplace_back(file);
    }
  }
  closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

void validate_stack_id(std::string_view stack_id) {
  if (stack_id.empty() || stack_id.size() > kMaxStackIdLength) {
    throw Error(Errc::invalid_argument, "stack id '" + std::string(stack_id) + "' must be 1 to " +
                                            std::to_string(kMaxStackIdLength) + " characters");
  }
  for (char c : stack_id) {
    if (!is_alnum(c) && c != '-' && c != '_') {
      throw Error(Errc::invalid_argument, "stack id '" + std::string(stack_id) +
                                              "' may hold only letters, digits, '-' and '_'");
    }
  }
}

void validate_segment_what(std::string_view what) {
  if (!valid_what(what)) {
    throw Error(Errc::invalid_argument,
                "segment part '" + std::string(what) + "' must be 1 to " +
                    std::to_string(kMaxWhatLength) +
                    " letters, digits, '_' or '.' (no '-': it separates the stack id)");
  }
}

void check_format_region(const void* base, uint64_t bytes, size_t alignment, uint64_t needed,
                         std::string_view what, const std::string& layout) {
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % alignment != 0)
    throw Error(Errc::invalid_argument, std::string(what) + ": memory must be " +
                                            std::to_string(alignment) + "-byte aligned");
  if (bytes < needed)
    throw Error(Errc::out_of_range, std::string(what) + ": " + layout + " need " +
                                        std::to_string(needed) + " bytes, region has " +
                                        std::to_string(bytes));
}

std::string segment_name(std::string_view stack_id, std::string_view what) {
  validate_stack_id(stack_id);
  validate_segment_what(what);
  return "/" + std::string(kPrefix) + std::string(stack_id) + "-" + std::string(what);
}

std::vector<std::string> list_stack_segments(std::string_view stack_id) {
  std::vector<std::string> names = stack_files(stack_id);
  for (auto& n : names) n.insert(n.begin(), '/');
  return names;
}

size_t remove_stack_segments(std::string_view stack_id) {
  size_t removed = 0;
  for (const std::string& name : list_stack_segments(stack_id)) {
    if (shm_unlink(name.c_str()) == 0) {
      ++removed;
    } else if (errno != ENOENT) {  // ENOENT: someone else removed it first
      throw Error(Errc::io, os_error("cannot unlink shm segment " + name, errno));
    }
  }
  return removed;
}

Segment Segment::create(const std::string& name, size_t bytes, Lifetime lifetime) {
  validate_name(name);
  if (bytes == 0) {
    throw Error(Errc::invalid_argument, "shm segment " + name + ": size must be > 0");
  }
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    if (errno == EEXIST) {
      throw Error(Errc::busy, "shm segment " + name +
                                  " already exists (a stack with this id is running, or a killed "
                                  "one left it: remove_stack_segments reclaims it)");
    }
    throw Error(Errc::io, os_error("cannot create shm segment " + name, errno));
  }
  // From here on the name is ours: any failure removes it again.
  auto fail = [&](const std::string& what, int err, Errc code) {
    close(fd);
    shm_unlink(name.c_str());
    throw Error(code, os_error("shm segment " + name + ": " + what, err));
  };
  if (fchmod(fd, 0600) != 0) fail("fchmod 0600", errno, Errc::io);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) fail("ftruncate", errno, Errc::io);
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    fail("cannot reserve " + std::to_string(bytes) + " bytes in " + kShmDir, err,
         err == ENOSPC ? Errc::busy : Errc::io);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("mmap", errno, Errc::io);
  struct stat created {};
  const uint64_t identity = fstat(fd, &created) == 0 ? static_cast<uint64_t>(created.st_ino) : 0;
  close(fd);  // the mapping keeps the memory alive

  Segment s;
  s.identity_ = identity;
  s.name_ = name;
  s.data_ = static_cast<uint8_t*>(p);
  s.size_ = bytes;
  s.access_ = Access::read_write;
  s.unlink_on_destroy_ = lifetime == Lifetime::unlink_on_destroy;
  return s;
}

Segment Segment::open(const std::string& name, Access access) {
  validate_name(name);
  bool rw = access == Access::read_write;
  int fd = shm_open(name.c_str(), rw ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) {
    if (errno == ENOENT) {
      throw Error(Errc::not_found, "shm segment " + name + " does not exist");
    }
    throw Error(Errc::io, os_error("cannot open shm segment " + name, errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    throw Error(Errc::io, os_error("cannot stat shm segment " + name, err));
  }
  if (st.st_size <= 0) {
    close(fd);
    throw Error(Errc::bad_format,
                "shm segment " + name + " is empty (its creator died before sizing it?)");
  }
  size_t bytes = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, bytes, rw ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) throw Error(Errc::io, os_error("cannot mmap shm segment " + name, err));

  Segment s;
  s.name_ = name;
  s.data_ = static_cast<uint8_t*>(p);
  s.size_ = bytes;
  s.access_ = access;
  s.identity_ = static_cast<uint64_t>(st.st_ino);
  return s;
}

uint64_t segment_identity(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return 0;
  struct stat st {};
  const uint64_t id = fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  close(fd);
  return id;
}

Segment::Segment(Segment&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      access_(other.access_),
      unlink_on_destroy_(std::exchange(other.unlink_on_destroy_, false)),
      identity_(std::exchange(other.identity_, 0)) {}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    access_ = other.access_;
    unlink_on_destroy_ = std::exchange(other.unlink_on_destroy_, false);
    identity_ = std::exchange(other.identity_, 0);
  }
  return *this;
}

Segment::~Segment() {
  release();
}

void Segment::release() noexcept {
  if (data_ != nullptr) munmap(data_, size_);
  if (unlink_on_destroy_) shm_unlink(name_.c_str());
  data_ = nullptr;
  size_ = 0;
  unlink_on_destroy_ = false;
}

void Segment::unlink() {
  unlink_on_destroy_ = false;
  if (shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    throw Error(Errc::io, os_error("cannot unlink shm segment " + name_, errno));
  }
}

}  // namespace duet::shm
