// memfd regions, the sequence-locked weights, and descriptor passing over a
// Unix socket (see shared_memory.h).
#include "common/shared_memory.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace dp {
namespace {

absl::Status Errno(const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// A weights buffer's header: the sequence counter (odd while dp-ps writes),
// the version, the encoding and the number of values. 64 bytes, so that the
// values start on a cache line.
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

// The buffer of version `step`: the first half of the region for even
// versions, the second for odd ones (WeightsRegionBytes makes both halves
// the same size, whole cache lines).
char* BufferOf(const SharedRegion& region, int64_t step) {
  return region.data() + static_cast<size_t>(step & 1) * (region.size() / 2);
}

WeightsHeader* HeaderOf(const SharedRegion& region, int64_t step) {
  return reinterpret_cast<WeightsHeader*>(BufferOf(region, step));
}

// A status payload, local to the process (never sent over the wire).
constexpr absl::string_view kMovedUrl = "type.dp-ps/weights-moved-under-read";

absl::Status MovedUnderRead(std::string message) {
  absl::Status s = absl::AbortedError(message);
  s.SetPayload(kMovedUrl, absl::Cord());
  return s;
}

absl::Status KeptChanging(absl::Duration patience) {
  return MovedUnderRead(
      absl::StrCat("the shared weights kept changing while read for ",
                   absl::FormatDuration(patience)));
}

constexpr size_t kTicketBytes = 16;  // 128 random bits, hex on the wire
constexpr size_t kTicketChars = 2 * kTicketBytes;
constexpr int kMaxFds = 4;
// Handovers served at once; more wait in the listen backlog.
constexpr size_t kMaxConnections = 64;

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(raw);
}

// Compares in time independent of where the strings differ: a ticket
// cannot be guessed a character at a time.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

// The address of `name` in the abstract namespace (leading NUL).
socklen_t AbstractAddress(const std::string& name, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                name.size());
}

void SetTimeout(int fd, int option, absl::Duration timeout) {
  timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, option, &tv, sizeof(tv));
}

void CloseAll(const std::vector<int>& fds) {
  for (int fd : fds) close(fd);
}

// The verdict byte, with `fds` attached when there are any.
void SendVerdict(int conn, const std::vector<int>& fds) {
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
  (void)sendmsg(conn, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Create(
    const char* name, size_t bytes, Peers peers) {
  const int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  auto fail = [fd](const char* what) {
    const absl::Status s = Errno(what);
    close(fd);
    return s;
  };
  // The mode keeps a non-root process of this user from reopening the
  // region through /proc with more access than it was handed; the seals
  // below hold against root too.
  if (fchmod(fd, peers == Peers::kReadOnly ? 0400 : 0600) != 0) {
    return fail("fchmod of shared memory");
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return fail("ftruncate of shared memory");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap of shared memory");
  // F_SEAL_FUTURE_WRITE after the mapping above: it stays writable, and no
  // other (a reopened descriptor's included) can be made.
  int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (peers == Peers::kReadOnly) seals |= F_SEAL_FUTURE_WRITE;
  if (fcntl(fd, F_ADD_SEALS, seals) != 0) {
    const absl::Status s = Errno("sealing shared memory");
    munmap(p, bytes);
    close(fd);
    return s;
  }
  return std::unique_ptr<SharedRegion>(
      new SharedRegion(fd, static_cast<char*>(p), bytes));
}

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Map(int fd,
                                                                size_t bytes,
                                                                bool writable) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const absl::Status s = Errno("fstat of shared memory");
    close(fd);
    return s;
  }
  if (static_cast<size_t>(st.st_size) < bytes || bytes == 0) {
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
  const size_t values =
      static_cast<size_t>(num_values) * BytesPerValue(encoding);
  const size_t line = kWeightsHeaderBytes;
  return 2 * (kWeightsHeaderBytes + (values + line - 1) / line * line);
}

char* BeginWeights(SharedRegion* region, int64_t step, Encoding encoding,
                   int64_t num_values) {
  WeightsHeader* h = HeaderOf(*region, step);
  const uint64_t seq = h->seq.load(std::memory_order_relaxed);
  DP_CHECK(seq % 2 == 0);  // one writer, one version at a time
  h->seq.store(seq + 1, std::memory_order_relaxed);  // odd: being written
  // The odd counter is visible before any of the writes below.
  std::atomic_thread_fence(std::memory_order_release);
  h->step = step;
  h->encoding = static_cast<uint32_t>(encoding);
  h->num_values = num_values;
  return BufferOf(*region, step) + kWeightsHeaderBytes;
}

void EndWeights(SharedRegion* region, int64_t step) {
  WeightsHeader* h = HeaderOf(*region, step);
  h->seq.store(h->seq.load(std::memory_order_relaxed) + 1,
               std::memory_order_release);
}

void PublishWeights(SharedRegion* region, int64_t step, Encoding encoding,
                    absl::Span<const float> values) {
  const auto n = static_cast<int64_t>(values.size());
  Encode(encoding, values.data(), n, BeginWeights(region, step, encoding, n));
  EndWeights(region, step);
}

absl::StatusOr<SharedWeights> FindWeights(const SharedRegion& region,
                                          int64_t step, int64_t num_values,
                                          absl::Duration patience) {
  const WeightsHeader* h = HeaderOf(region, step);
  // dp-ps rewrites this buffer only after an update that needs this
  // worker's next push, and a publish is one copy of the weights: a look
  // that meets one waits for it to end. Many in a row mean dp-ps is stuck
  // or something else writes here.
  const absl::Time give_up = absl::Now() + patience;
  for (int attempt = 0;; ++attempt) {
    if (attempt >= 64) {
      if (absl::Now() > give_up) break;
      sched_yield();  // let a descheduled writer finish
    }
    const uint64_t seq = h->seq.load(std::memory_order_acquire);
    if (seq % 2 == 1) continue;
    SharedWeights found;
    found.step = h->step;
    found.num_values = h->num_values;
    found.seq = seq;
    const uint32_t e = h->encoding;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (h->seq.load(std::memory_order_relaxed) != seq) continue;
    if ((e != static_cast<uint32_t>(Encoding::kF32) &&
         e != static_cast<uint32_t>(Encoding::kBf16)) ||
        found.num_values != num_values ||
        WeightsRegionBytes(num_values, static_cast<Encoding>(e)) >
            region.size()) {
      return absl::DataLossError(absl::StrFormat(
          "the shared weights' buffer %d holds %d values in encoding %d; "
          "expected %d",
          step & 1, found.num_values, e, num_values));
    }
    if (found.step != step) {
      return MovedUnderRead(absl::StrFormat(
          "the shared weights' buffer of version %d holds version %d: "
          "re-sync",
          step, found.step));
    }
    found.encoding = static_cast<Encoding>(e);
    found.values = BufferOf(region, step) + kWeightsHeaderBytes;
    return found;
  }
  return KeptChanging(patience);
}

bool IsMovedUnderRead(const absl::Status& status) {
  return status.GetPayload(kMovedUrl).has_value();
}

absl::Status MarkedMovedUnderRead(const absl::Status& status) {
  absl::Status s = status;
  s.SetPayload(kMovedUrl, absl::Cord());
  return s;
}

bool StillHolds(const SharedRegion& region, const SharedWeights& found) {
  // Every read of the values before the fence happened before this load.
  std::atomic_thread_fence(std::memory_order_acquire);
  return HeaderOf(region, found.step)->seq.load(std::memory_order_relaxed) ==
         found.seq;
}

absl::Status ReadWeights(const SharedRegion& region, int64_t step,
                         absl::Span<float> out, absl::Duration patience) {
  const absl::Time give_up = absl::Now() + patience;
  for (;;) {
    ASSIGN_OR_RETURN(
        const SharedWeights found,
        FindWeights(region, step, static_cast<int64_t>(out.size()),
                    std::max(give_up - absl::Now(), absl::ZeroDuration())));
    Decode(found.encoding, found.values, found.num_values, out.data());
    if (StillHolds(region, found)) return absl::OkStatus();
    if (absl::Now() > give_up) return KeptChanging(patience);
  }
}

SharedMemoryOffer::SharedMemoryOffer(int listen_fd, std::string name,
                                     absl::Duration ticket_lifetime)
    : listen_fd_(listen_fd),
      name_(std::move(name)),
      ticket_lifetime_(ticket_lifetime) {
  thread_ = std::thread([this] { Serve(); });
}

absl::StatusOr<std::unique_ptr<SharedMemoryOffer>> SharedMemoryOffer::Start(
    absl::Duration ticket_lifetime) {
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
  return std::unique_ptr<SharedMemoryOffer>(
      new SharedMemoryOffer(fd, name, ticket_lifetime));
}

SharedMemoryOffer::~SharedMemoryOffer() {
  stopping_.store(true);
  shutdown(listen_fd_, SHUT_RDWR);
  thread_.join();
  close(listen_fd_);
  absl::MutexLock lock(&mu_);
  for (auto& [owner, ticket] : tickets_) CloseAll(ticket.fds);
}

std::string SharedMemoryOffer::IssueTicket(int owner, std::vector<int> fds) {
  Ticket ticket{RandomHex(kTicketBytes), std::move(fds),
                absl::Now() + ticket_lifetime_};
  std::string secret = ticket.secret;
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = tickets_.try_emplace(owner);
  if (!inserted) CloseAll(it->second.fds);
  it->second = std::move(ticket);
  return secret;
}

int SharedMemoryOffer::outstanding_tickets() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(tickets_.size());
}

std::vector<int> SharedMemoryOffer::Redeem(absl::string_view secret) {
  absl::MutexLock lock(&mu_);
  for (auto it = tickets_.begin(); it != tickets_.end(); ++it) {
    if (SameSecret(it->second.secret, secret)) {
      std::vector<int> fds = std::move(it->second.fds);
      tickets_.erase(it);
      return fds;
    }
  }
  return {};
}

void SharedMemoryOffer::WithdrawExpired(absl::Time now) {
  absl::MutexLock lock(&mu_);
  for (auto it = tickets_.begin(); it != tickets_.end();) {
    if (it->second.expires <= now) {
      CloseAll(it->second.fds);
      it = tickets_.erase(it);
    } else {
      ++it;
    }
  }
}

void SharedMemoryOffer::Serve() {
  // A handover under way: the connection and what it sent so far.
  struct Handover {
    int conn;
    std::string received;
    absl::Time deadline;
  };
  std::vector<Handover> handovers;
  absl::Time accept_again;  // after a failed accept (EMFILE): not at once
  while (!stopping_.load()) {
    const absl::Time now = absl::Now();
    WithdrawExpired(now);
    for (auto it = handovers.begin(); it != handovers.end();) {
      if (it->deadline <= now) {
        close(it->conn);
        it = handovers.erase(it);
      } else {
        ++it;
      }
    }
    std::vector<pollfd> polled;
    const bool accepting =
        handovers.size() < kMaxConnections && now >= accept_again;
    if (accepting) polled.push_back({listen_fd_, POLLIN, 0});
    for (const Handover& h : handovers) polled.push_back({h.conn, POLLIN, 0});
    if (poll(polled.data(), polled.size(), 100) <= 0) continue;
    size_t i = 0;
    if (accepting && polled[i++].revents != 0) {
      const int conn =
          accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      ucred peer{};
      socklen_t peer_len = sizeof(peer);
      if (conn < 0) {
        if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
          accept_again = now + absl::Milliseconds(100);
        }
      } else if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) !=
                     0 ||
                 peer.uid != geteuid()) {
        // Only a process of dp-ps's own uid: another user gets nothing, and
        // so does root when dp-ps is not root.
        SendVerdict(conn, {});
        close(conn);
      } else {
        handovers.push_back({conn, "", now + kHandoverTimeout});
      }
    }
    // The connections polled are handovers[0, polled.size() - i).
    std::vector<int> finished;
    for (size_t k = 0; i < polled.size(); ++i, ++k) {
      if (polled[i].revents == 0) continue;
      Handover& h = handovers[k];
      char buf[kTicketChars];
      const ssize_t n = read(h.conn, buf, kTicketChars - h.received.size());
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n > 0) h.received.append(buf, static_cast<size_t>(n));
      if (n > 0 && h.received.size() < kTicketChars) continue;
      if (h.received.size() == kTicketChars) {
        const std::vector<int> fds = Redeem(h.received);
        SendVerdict(h.conn, fds);
        CloseAll(fds);
      }
      finished.push_back(h.conn);
    }
    for (int conn : finished) {
      close(conn);
      handovers.erase(
          std::find_if(handovers.begin(), handovers.end(),
                       [conn](const Handover& h) { return h.conn == conn; }));
    }
  }
  for (const Handover& h : handovers) close(h.conn);
}

absl::StatusOr<std::vector<int>> FetchSharedMemory(
    const std::string& socket_name, const std::string& ticket, size_t count) {
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
  SetTimeout(fd, SO_RCVTIMEO, absl::Seconds(5));
  SetTimeout(fd, SO_SNDTIMEO, absl::Seconds(5));
  // MSG_NOSIGNAL: dp-ps closes at once on a peer it refuses (another
  // user), and a write to that socket must be a refusal, not SIGPIPE. The
  // verdict may be waiting all the same: it is read below either way.
  (void)send(fd, ticket.data(), ticket.size(), MSG_NOSIGNAL);
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
  // Every descriptor that arrived, in every control message: each is ours
  // to close if the answer is refused.
  std::vector<int> fds;
  for (cmsghdr* c = n > 0 ? CMSG_FIRSTHDR(&msg) : nullptr; c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const size_t at = fds.size();
      fds.resize(at + k);
      std::memcpy(fds.data() + at, CMSG_DATA(c), k * sizeof(int));
    }
  }
  if (n <= 0 || verdict != 1 || fds.empty()) {
    CloseAll(fds);
    return absl::PermissionDeniedError(
        "dp-ps refused the shared-memory ticket (used already, withdrawn, or "
        "another user)");
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0 || fds.size() != count) {
    CloseAll(fds);
    return absl::DataLossError(absl::StrFormat(
        "dp-ps handed %d%s shared-memory descriptors, expected %d", fds.size(),
        (msg.msg_flags & MSG_CTRUNC) != 0 ? " or more" : "", count));
  }
  return fds;
}

}  // namespace dp
