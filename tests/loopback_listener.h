// A listening TCP socket on 127.0.0.1 and a free port: a port held busy, or
// a peer to connect to, for tests over real sockets.
#ifndef DP_TESTS_LOOPBACK_LISTENER_H_
#define DP_TESTS_LOOPBACK_LISTENER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace dp {

// The listening socket (the caller closes it), its port in *port; -1 when
// none could be made.
inline int ListenOnLoopback(int* port, int backlog = 4) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(fd, backlog) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace dp

#endif  // DP_TESTS_LOOPBACK_LISTENER_H_
