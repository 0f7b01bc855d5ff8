// A TCP relay from an IPv6 address to a port on 127.0.0.1. The metrics
// endpoints need it: Debian 12's civetweb, which serves prometheus-cpp's
// Exposer, is built without IPv6 (mg_check_feature(8) is 0), so it cannot
// listen on an IPv6 address, and on an IPv6-only or IPv6-primary cluster
// Prometheus scrapes the pod's IPv6 address. Each accepted connection is
// copied both ways, byte for byte, to civetweb's IPv4 listener.
#ifndef DP_COMMON_TCP_RELAY_H_
#define DP_COMMON_TCP_RELAY_H_

#include <atomic>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace dp {

class TcpRelay {
 public:
  // Listens on [host]:port, host an IPv6 literal ("::" for every IPv6
  // address; IPV6_V6ONLY, so an IPv4 listener may share the port), port 0
  // for any free one, and relays each connection to 127.0.0.1:target_port.
  // UNAVAILABLE naming the address when it cannot listen; FAILED_PRECONDITION
  // when the host has no IPv6 at all (kernel without it, or disabled).
  static absl::StatusOr<std::unique_ptr<TcpRelay>> Start(
      const std::string& host, int port, int target_port);
  // Stops accepting, closes the connections it relays, and joins its
  // threads.
  ~TcpRelay();

  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  int port() const { return port_; }

 private:
  // A relayed connection; its thread sets `done` as it ends.
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  TcpRelay(int listen_fd, int wake_fd, int port, int target_port);
  // Accepts until the relay stops, then joins every connection's thread.
  void Accept();
  // Copies between `client` and a new connection to the target until both
  // sides have closed, the connection idles, or the relay stops; then
  // closes both.
  void Relay(int client);

  const int listen_fd_;
  // Readable once the relay stops: every thread polls it.
  const int wake_fd_;
  const int port_;
  const int target_port_;
  std::thread acceptor_;
  // Only the acceptor thread touches it.
  std::list<std::unique_ptr<Connection>> connections_;
};

}  // namespace dp

#endif  // DP_COMMON_TCP_RELAY_H_
