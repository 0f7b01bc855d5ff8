// memfd regions, the sequence-locked weights, and descriptor passing over a
// Unix socket (see shared_memory.h).
#include "common/shared_memory.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"

namespace dp {
namespace {

absl::Status Errno(const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// The weights region's header: the sequence counter (odd while dp-ps
// writes), the version, the encoding and the number of values. 64 bytes, so
// that the values start on a cache line.
struct WeightsHeader {
  std::atomic<uint64_t> seq;
  int64_t step;
  int64_t num_values;
  uint32_t encoding;
};
constexpr size_t kWeightsHeaderBytes = 64;
static_assert(sizeof(WeightsHeader) <= kWeightsHeaderBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the sequence counter is shared between processes");

WeightsHeader* HeaderOf(const SharedRegion& region) {
  return reinterpret_cast<WeightsHeader*>(region.data());
}

constexpr size_t kTicketBytes = 16;  // 128 random bits, hex on the wire
constexpr int kMaxFds = 4;

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(raw);
}

// The address of `name` in the abstract namespace (leading NUL).
socklen_t AbstractAddress(const std::string& name, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                name.size());
}

void SetTimeout(int fd, int option, int seconds) {
  timeval tv{seconds, 0};
  setsockopt(fd, SOL_SOCKET, option, &tv, sizeof(tv));
}

bool ReadFully(int fd, char* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = read(fd, out + got, n - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Create(
    const char* name, size_t bytes) {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return Errno("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const absl::Status s = Errno("ftruncate of shared memory");
    close(fd);
    return s;
  }
  return Map(fd, bytes, /*writable=*/true);
}

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Map(int fd,
                                                                size_t bytes,
                                                                bool writable) {
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes ||
      bytes == 0) {
    close(fd);
    return absl::DataLossError(
        absl::StrFormat("shared memory of %d bytes where %d are needed",
                        static_cast<int64_t>(st.st_size), bytes));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | (writable ? PROT_WRITE : 0),
                 MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const absl::Status s = Errno("mmap of shared memory");
    close(fd);
    return s;
  }
  return std::unique_ptr<SharedRegion>(
      new SharedRegion(fd, static_cast<char*>(p), bytes));
}

SharedRegion::~SharedRegion() {
  munmap(data_, size_);
  close(fd_);
}

absl::StatusOr<int> SharedRegion::ReadOnlyDescriptor() const {
  const int fd =
      open(absl::StrCat("/proc/self/fd/", fd_).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("read-only descriptor of shared memory");
  return fd;
}

size_t WeightsRegionBytes(int64_t num_values, Encoding encoding) {
  return kWeightsHeaderBytes +
         static_cast<size_t>(num_values) * BytesPerValue(encoding);
}

void PublishWeights(SharedRegion* region, int64_t step, Encoding encoding,
                    absl::string_view encoded) {
  WeightsHeader* h = HeaderOf(*region);
  const uint64_t seq = h->seq.load(std::memory_order_relaxed);
  h->seq.store(seq + 1, std::memory_order_relaxed);  // odd: being written
  // The odd counter is visible before any of the writes below.
  std::atomic_thread_fence(std::memory_order_release);
  h->step = step;
  h->encoding = static_cast<uint32_t>(encoding);
  h->num_values =
      static_cast<int64_t>(encoded.size() / BytesPerValue(encoding));
  std::memcpy(region->data() + kWeightsHeaderBytes, encoded.data(),
              encoded.size());
  h->seq.store(seq + 2, std::memory_order_release);
}

absl::StatusOr<int64_t> ReadWeights(const SharedRegion& region,
                                    absl::Span<float> out) {
  const WeightsHeader* h = HeaderOf(region);
  const int64_t num_values = static_cast<int64_t>(out.size());
  // A writer rewrites the region only after an update, which needs this
  // worker's next push: a retry is rare, and many mean something is wrong.
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const uint64_t before = h->seq.load(std::memory_order_acquire);
    if (before % 2 == 1) continue;
    const int64_t step = h->step;
    const uint32_t e = h->encoding;
    if ((e != static_cast<uint32_t>(Encoding::kF32) &&
         e != static_cast<uint32_t>(Encoding::kBf16)) ||
        h->num_values != num_values ||
        WeightsRegionBytes(num_values, static_cast<Encoding>(e)) >
            region.size()) {
      if (h->seq.load(std::memory_order_acquire) != before) continue;
      return absl::DataLossError(absl::StrFormat(
          "the shared weights hold %d values in encoding %d; expected %d",
          h->num_values, e, num_values));
    }
    Decode(static_cast<Encoding>(e), region.data() + kWeightsHeaderBytes,
           num_values, out.data());
    std::atomic_thread_fence(std::memory_order_acquire);
    if (h->seq.load(std::memory_order_relaxed) == before) return step;
  }
  return absl::AbortedError("the shared weights kept changing while read");
}

SharedMemoryOffer::SharedMemoryOffer(int listen_fd, std::string name)
    : listen_fd_(listen_fd), name_(std::move(name)) {
  thread_ = std::thread([this] { Serve(); });
}

absl::StatusOr<std::unique_ptr<SharedMemoryOffer>> SharedMemoryOffer::Start() {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket for shared memory");
  const std::string name = absl::StrCat("dp-ps-", RandomHex(16));
  sockaddr_un addr;
  const socklen_t len = AbstractAddress(name, &addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(fd, 64) != 0) {
    const absl::Status s = Errno("bind of the shared-memory socket");
    close(fd);
    return s;
  }
  return std::unique_ptr<SharedMemoryOffer>(new SharedMemoryOffer(fd, name));
}

SharedMemoryOffer::~SharedMemoryOffer() {
  stopping_.store(true);
  shutdown(listen_fd_, SHUT_RDWR);
  thread_.join();
  close(listen_fd_);
  absl::MutexLock lock(&mu_);
  for (auto& [ticket, fds] : tickets_) {
    for (int fd : fds) close(fd);
  }
}

std::string SharedMemoryOffer::Add(std::vector<int> fds) {
  std::string ticket = RandomHex(kTicketBytes);
  absl::MutexLock lock(&mu_);
  tickets_[ticket] = std::move(fds);
  return ticket;
}

void SharedMemoryOffer::Serve() {
  while (!stopping_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    SetTimeout(conn, SO_RCVTIMEO, 2);
    SetTimeout(conn, SO_SNDTIMEO, 2);
    ucred peer{};
    socklen_t peer_len = sizeof(peer);
    std::string ticket(2 * kTicketBytes, '\0');
    std::vector<int> fds;
    // Only a process of this user, with a ticket that is still open.
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) == 0 &&
        (peer.uid == geteuid() || geteuid() == 0) &&
        ReadFully(conn, ticket.data(), ticket.size())) {
      absl::MutexLock lock(&mu_);
      auto it = tickets_.find(ticket);
      if (it != tickets_.end()) {
        fds = std::move(it->second);
        tickets_.erase(it);
      }
    }
    char verdict = fds.empty() ? 0 : 1;
    iovec iov{&verdict, 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
    if (!fds.empty() && fds.size() <= kMaxFds) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    (void)sendmsg(conn, &msg, MSG_NOSIGNAL);
    for (int fd : fds) close(fd);
    close(conn);
  }
}

absl::StatusOr<std::vector<int>> FetchSharedMemory(
    const std::string& socket_name, const std::string& ticket) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  sockaddr_un addr;
  const socklen_t len = AbstractAddress(socket_name, &addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    const int error = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat(
        "dp-ps's shared memory is not reachable from here (",
        std::strerror(error), "): another host or network namespace"));
  }
  SetTimeout(fd, SO_RCVTIMEO, 5);
  SetTimeout(fd, SO_SNDTIMEO, 5);
  if (write(fd, ticket.data(), ticket.size()) !=
      static_cast<ssize_t>(ticket.size())) {
    const absl::Status s = Errno("sending the shared-memory ticket");
    close(fd);
    return s;
  }
  char verdict = 0;
  iovec iov{&verdict, 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  close(fd);
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n > 0 && c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      fds.resize(count);
      std::memcpy(fds.data(), CMSG_DATA(c), count * sizeof(int));
    }
  }
  if (n <= 0 || verdict != 1 || fds.empty()) {
    for (int f : fds) close(f);
    return absl::PermissionDeniedError(
        "dp-ps refused the shared-memory ticket (used already, or another "
        "user)");
  }
  return fds;
}

}  // namespace dp
