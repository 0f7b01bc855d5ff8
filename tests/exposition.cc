// Exposition-format parsing and a minimal HTTP GET for tests.
#include "tests/exposition.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace dp {

std::string SeriesKey(const std::string& name,
                      const std::map<std::string, std::string>& labels) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : labels)
    parts.push_back(absl::StrCat(k, "=\"", v, "\""));
  return absl::StrCat(name, "{", absl::StrJoin(parts, ","), "}");
}

std::map<std::string, double> ParseExposition(const std::string& text) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    const auto bad = [&] { out[absl::StrCat("!malformed: ", line)] = 0; };
    std::string name;
    std::map<std::string, std::string> labels;
    absl::string_view rest;
    const size_t brace = line.find('{');
    const size_t space = line.find(' ');
    if (brace != absl::string_view::npos && brace < space) {
      name = std::string(line.substr(0, brace));
      const size_t close = line.find('}', brace);
      if (close == absl::string_view::npos) {
        bad();
        continue;
      }
      // Our label values never contain '"', ',' or '}'.
      for (absl::string_view kv :
           absl::StrSplit(line.substr(brace + 1, close - brace - 1), ',',
                          absl::SkipEmpty())) {
        const size_t eq = kv.find('=');
        if (eq == absl::string_view::npos || kv.size() < eq + 3) {
          bad();
          continue;
        }
        labels[std::string(kv.substr(0, eq))] =
            std::string(kv.substr(eq + 2, kv.size() - eq - 3));
      }
      rest = line.substr(close + 1);
    } else if (space != absl::string_view::npos) {
      name = std::string(line.substr(0, space));
      rest = line.substr(space);
    } else {
      bad();
      continue;
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(absl::StripAsciiWhitespace(rest), ' ');
    double value = 0;
    if (fields.empty() || !absl::SimpleAtod(fields[0], &value)) {
      bad();
      continue;
    }
    out[SeriesKey(name, labels)] = value;
  }
  return out;
}

std::optional<double> Sample(const std::map<std::string, double>& samples,
                             const std::string& name,
                             const std::map<std::string, std::string>& labels) {
  auto it = samples.find(SeriesKey(name, labels));
  if (it == samples.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::string> HttpGet(const std::string& host, int port,
                                    const std::string& path,
                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // An IPv6 literal ("::1") goes in brackets in the URL and Host header.
  const std::string authority =
      absl::StrContains(host, ':') ? absl::StrCat("[", host, "]") : host;
  const std::string where =
      absl::StrFormat("http://%s:%d%s", authority, port, path);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addr = nullptr;
  if (getaddrinfo(host.c_str(), absl::StrCat(port).c_str(), &hints, &addr) !=
          0 ||
      addr == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve ", where));
  }
  const int fd = socket(addr->ai_family, SOCK_STREAM, 0);
  const bool connected =
      fd >= 0 && connect(fd, addr->ai_addr, addr->ai_addrlen) == 0;
  freeaddrinfo(addr);
  if (!connected) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("GET ", where, ": ", why));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", authority, "\r\n\r\n");
  if (write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("GET ", where, ": write failed"));
  }
  std::string response;
  char buf[8192];
  for (;;) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd p{fd, POLLIN, 0};
    if (left_ms <= 0 || poll(&p, 1, static_cast<int>(left_ms)) <= 0) {
      close(fd);
      return absl::DeadlineExceededError(
          absl::StrCat("GET ", where, ": no complete answer within ",
                       absl::FormatDuration(timeout)));
    }
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // HTTP/1.0: the server closes after the body
    response.append(buf, n);
  }
  close(fd);
  const size_t header_end = response.find("\r\n\r\n");
  const std::string status_line = response.substr(0, response.find("\r\n"));
  if (header_end == std::string::npos ||
      status_line.find(" 200 ") == std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("GET ", where, ": '", status_line, "'"));
  }
  return response.substr(header_end + 4);
}

bool HasIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  const bool ok =
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace dp
