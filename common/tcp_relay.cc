// The IPv6-to-IPv4 TCP relay of the metrics endpoints (see tcp_relay.h).
#include "common/tcp_relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_format.h"

namespace dp {
namespace {

// Prometheus keeps one connection per target; a few more for curl and
// overlapping scrapes. Connections beyond are closed at once.
constexpr size_t kMaxConnections = 16;
// A connection with no byte either way for this long is closed (a scrape
// takes milliseconds; Prometheus reconnects when it needs to).
constexpr int kIdleMs = 60 * 1000;
constexpr timeval kSendTimeout = {10, 0};

bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpRelay>> TcpRelay::Start(
    const std::string& host, int port, int target_port) {
  const std::string address = absl::StrFormat("[%s]:%d", host, port);
  sockaddr_in6 addr = {};
  addr.sin6_family = AF_INET6;
  addr.sin6_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET6, host.c_str(), &addr.sin6_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is not an IPv6 address", host));
  }
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no IPv6 on this host (socket: %s)", std::strerror(errno)));
  }
  const int on = 1;
  setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on));
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 16) != 0) {
    const int error = errno;
    close(fd);
    // "::" not assignable: IPv6 is disabled (disable_ipv6=1).
    if (error == EADDRNOTAVAIL && IN6_IS_ADDR_UNSPECIFIED(&addr.sin6_addr)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "no IPv6 on this host (bind %s: %s)", address, std::strerror(error)));
    }
    return absl::UnavailableError(absl::StrFormat(
        "cannot listen on %s: %s", address, std::strerror(error)));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    close(fd);
    return absl::UnavailableError(
        absl::StrFormat("eventfd: %s", std::strerror(errno)));
  }
  std::unique_ptr<TcpRelay> relay(
      new TcpRelay(fd, wake, ntohs(addr.sin6_port), target_port));
  relay->acceptor_ = std::thread([r = relay.get()] { r->Accept(); });
  return relay;
}

TcpRelay::TcpRelay(int listen_fd, int wake_fd, int port, int target_port)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      port_(port),
      target_port_(target_port) {}

TcpRelay::~TcpRelay() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  acceptor_.join();
  close(listen_fd_);
  close(wake_fd_);
}

void TcpRelay::Accept() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (fds[1].revents != 0) break;
    if (fds[0].revents == 0) continue;
    const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) {
      // Out of descriptors (EMFILE) or memory: the connection stays in the
      // backlog and the listener readable, so polling again at once would
      // spin. Wait a little (or for the stop) before the next try.
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        pollfd wake{wake_fd_, POLLIN, 0};
        if (poll(&wake, 1, 100) > 0) break;
      }
      continue;
    }
    connections_.remove_if([](const std::unique_ptr<Connection>& c) {
      if (!c->done.load()) return false;
      c->thread.join();
      return true;
    });
    if (connections_.size() >= kMaxConnections) {
      close(client);
      continue;
    }
    auto c = std::make_unique<Connection>();
    c->thread = std::thread([this, client, done = &c->done] {
      Relay(client);
      done->store(true);
    });
    connections_.push_back(std::move(c));
  }
  // They see wake_fd_ too.
  for (const std::unique_ptr<Connection>& c : connections_) c->thread.join();
  connections_.clear();
}

void TcpRelay::Relay(int client) {
  const int upstream = ConnectLoopback(target_port_);
  if (upstream >= 0) {
    setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &kSendTimeout,
               sizeof(kSendTimeout));
    setsockopt(upstream, SOL_SOCKET, SO_SNDTIMEO, &kSendTimeout,
               sizeof(kSendTimeout));
    // from[i] copies into to[i]; -1 once that direction has ended.
    int from[2] = {client, upstream};
    const int to[2] = {upstream, client};
    char buf[64 * 1024];
    while (from[0] >= 0 || from[1] >= 0) {
      pollfd fds[3] = {
          {from[0], POLLIN, 0}, {from[1], POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      const int ready = poll(fds, 3, kIdleMs);
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0 || fds[2].revents != 0) break;
      bool failed = false;
      for (int i = 0; i < 2 && !failed; ++i) {
        if (from[i] < 0 || fds[i].revents == 0) continue;
        const ssize_t n = recv(from[i], buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n > 0) {
          failed = !WriteAll(to[i], buf, static_cast<size_t>(n));
        } else if (n == 0) {
          // Half-close: the other side still gets what is in flight.
          shutdown(to[i], SHUT_WR);
          from[i] = -1;
        } else {
          failed = true;
        }
      }
      if (failed) break;
    }
    close(upstream);
  }
  close(client);
}

}  // namespace dp
