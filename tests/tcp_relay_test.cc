// The IPv6 relay of the metrics endpoints (common/tcp_relay.h) over real
// sockets: bytes both ways with a half-close passed on, and a prompt stop
// while a client keeps an idle connection open (as Prometheus does).
#include "common/tcp_relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/exposition.h"
#include "tests/loopback_listener.h"

namespace dp {
namespace {

// A connection to [::1]:port, -1 if none.
int ConnectIpv6Loopback(int port) {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  addr.sin6_port = htons(static_cast<uint16_t>(port));
  if (fd < 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

std::string ReadToEnd(int fd) {
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  return out;
}

TEST(TcpRelayTest, CopiesBothWaysAndPassesOnAHalfClose) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback on this host";
  int target_port = 0;
  const int listener = ListenOnLoopback(&target_port);
  ASSERT_GE(listener, 0);
  // The target answers once the client has finished sending.
  std::thread target([listener] {
    const int c = accept(listener, nullptr, nullptr);
    const std::string got = ReadToEnd(c);
    const std::string reply = absl::StrCat("got ", got.size(), ": ", got);
    [[maybe_unused]] ssize_t n = write(c, reply.data(), reply.size());
    close(c);
  });
  auto relay = TcpRelay::Start("::1", 0, target_port);
  ASSERT_TRUE(relay.ok()) << relay.status();
  const int client = ConnectIpv6Loopback((*relay)->port());
  ASSERT_GE(client, 0);
  ASSERT_EQ(write(client, "hello", 5), 5);
  shutdown(client, SHUT_WR);
  EXPECT_EQ(ReadToEnd(client), "got 5: hello");
  close(client);
  target.join();
  close(listener);
}

TEST(TcpRelayTest, StopsAtOnceWithAnIdleConnectionOpen) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback on this host";
  int target_port = 0;
  const int listener = ListenOnLoopback(&target_port);
  ASSERT_GE(listener, 0);
  auto relay = TcpRelay::Start("::", 0, target_port);
  ASSERT_TRUE(relay.ok()) << relay.status();
  const int client = ConnectIpv6Loopback((*relay)->port());
  ASSERT_GE(client, 0);
  // The relay has connected to the target: the connection is relayed.
  const int upstream = accept(listener, nullptr, nullptr);
  ASSERT_GE(upstream, 0);
  // A relay that waited for its idle connection would never stop: the
  // bound is only far below ctest's timeout, whatever the machine's speed.
  const absl::Time start = absl::Now();
  relay->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
  // Both sides see the relay close.
  EXPECT_EQ(ReadToEnd(client), "");
  EXPECT_EQ(ReadToEnd(upstream), "");
  close(client);
  close(upstream);
  close(listener);
}

TEST(TcpRelayTest, AnIpv4AddressIsRefusedNamingIt) {
  auto relay = TcpRelay::Start("127.0.0.1", 0, 1);
  ASSERT_FALSE(relay.ok());
  EXPECT_EQ(relay.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(relay.status().message().find("127.0.0.1"), std::string::npos);
}

}  // namespace
}  // namespace dp
