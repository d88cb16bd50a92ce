#include "deploy/supervisor/stack_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/base/error.h"
#include "core/ipc/run_dir.h"
#include "shm/segment.h"

namespace duet::supervisor {

namespace {

int parse_pid(const std::string& text) {
  try {
    long v = std::stol(text);
    return v > 0 && v < (1L << 22) ? static_cast<int>(v) : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

std::string read_all(int fd) {
  std::string out;
  char buf[64];
  lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

}  // namespace

int read_supervisor_pid(const std::string& run_dir) {
  std::ifstream f(pid_file_path(run_dir));
  std::string text;
  if (!f || !std::getline(f, text)) return 0;
  return parse_pid(text);
}

StackLock::StackLock(std::string stack_id, std::string run_dir)
    : stack_id_(std::move(stack_id)), run_dir_(std::move(run_dir)) {
  validate_stack_id(stack_id_);
  make_private_dir(run_dir_);
  pid_path_ = pid_file_path(run_dir_);
  // The file we locked may be unlinked by a supervisor finishing its `down` in between: retry
  // until the locked inode is the one at the path.
  for (int attempt = 0; attempt < 50; ++attempt) {
    make_private_dir(run_dir_);
    int fd = open(pid_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) throw Error(Errc::io, "cannot open '" + pid_path_ + "': " + std::strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int err = errno;
      int holder = parse_pid(read_all(fd));
      close(fd);
      if (err == EWOULDBLOCK)
        throw Error(Errc::busy, "stack '" + stack_id_ + "' is already up (supervisor pid " +
                                    std::to_string(holder) + ", run dir " + run_dir_ +
                                    "): run `duet stack down --stack " + stack_id_ +
                                    "` first or pick another --stack id");
      throw Error(Errc::io, "cannot lock '" + pid_path_ + "': " + std::strerror(err));
    }
    struct stat locked {
    }, at_path{};
    if (fstat(fd, &locked) != 0 || stat(pid_path_.c_str(), &at_path) != 0 ||
        locked.st_ino != at_path.st_ino || locked.st_dev != at_path.st_dev) {
      close(fd);
      continue;
    }
    fd_ = fd;
    break;
  }
  if (fd_ < 0) throw Error(Errc::busy, "could not lock '" + pid_path_ + "': it keeps changing");

  stale_pid_ = parse_pid(read_all(fd_));
  std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(fd_, 0) != 0 ||
      pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    throw Error(Errc::io, "cannot write '" + pid_path_ + "': " + std::strerror(errno));
}

void StackLock::reclaim() {
  // No live supervisor holds this stack and none of its services is adopted: every segment and
  // socket of it is left over.
  reclaimed_segments_ = static_cast<int>(shm::remove_stack_segments(stack_id_));
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(run_dir_, ec)) {
    if (e.path().extension() == ".sock" && std::filesystem::remove(e.path(), ec))
      ++reclaimed_sockets_;
  }
}

StackLock::~StackLock() {
  if (fd_ >= 0) close(fd_);
}

void StackLock::remove_run_dir() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(run_dir_, ec)) {
    if (e.path() == pid_path_) continue;
    std::filesystem::remove_all(e.path(), ec);
  }
  unlink(pid_path_.c_str());
  rmdir(run_dir_.c_str());
}

}  // namespace duet::supervisor
