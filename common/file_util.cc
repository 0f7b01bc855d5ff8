// POSIX file reading and crash-safe (temp + fsync + rename) file writing.
#include "common/file_util.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace dp {
namespace {

// "<what> <path>: <strerror(e)>", with the status code that errno implies.
absl::Status ErrnoError(int e, absl::string_view what,
                        const std::string& path) {
  return absl::ErrnoToStatus(e, absl::StrCat(what, " ", path));
}

// close() that keeps errno of an earlier failure intact.
void CloseQuietly(int fd) {
  const int saved = errno;
  ::close(fd);
  errno = saved;
}

// Writes all of `data`, retrying short writes and EINTR. Returns 0 or errno.
int WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  std::string contents;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    contents.reserve(static_cast<size_t>(st.st_size));
  }
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      return ErrnoError(e, "cannot read", path);
    }
    if (n == 0) break;
    contents.append(buf, static_cast<size_t>(n));
  }
  if (::close(fd) != 0) return ErrnoError(errno, "cannot read", path);
  return contents;
}

absl::Status WriteFileAtomic(const std::string& path,
                             absl::string_view contents) {
  // A name of its own for every write - process id and a per-process
  // count - created exclusively: two writers of one path (threads, or
  // processes sharing a directory) must never truncate or rename each
  // other's temporary file.
  static std::atomic<uint64_t> writes{0};
  const std::string tmp =
      absl::StrCat(path, ".tmp.", ::getpid(), ".", writes.fetch_add(1));
  const int fd = ::open(tmp.c_str(),
                        O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "cannot write", path);

  int e = WriteAll(fd, contents);
  if (e == 0 && ::fsync(fd) != 0) e = errno;
  if (e != 0) {
    CloseQuietly(fd);
  } else if (::close(fd) != 0) {
    e = errno;  // NFS and quota errors may only surface at close.
  }
  if (e == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) e = errno;
  if (e != 0) {
    ::unlink(tmp.c_str());
    return ErrnoError(e, "cannot write", path);
  }

  // Makes the rename itself durable. A failure here cannot be undone: `path`
  // already holds the new contents, but they may not survive a crash.
  const std::string dir = DirName(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoError(errno, "cannot sync directory of", path);
  if (::fsync(dfd) != 0) {
    const int de = errno;
    ::close(dfd);
    return ErrnoError(de, "cannot sync directory of", path);
  }
  ::close(dfd);
  return absl::OkStatus();
}

}  // namespace dp
