// Test helpers for the Prometheus side: parse the text exposition format into
// series -> value, and fetch a URL over plain HTTP/1.0 (IPv4 or IPv6).
#ifndef DP_TESTS_EXPOSITION_H_
#define DP_TESTS_EXPOSITION_H_

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dp {

// Series key: name{k1="v1",k2="v2"} with the labels sorted by name, e.g.
// SeriesKey("dp_x_total", {{"role", "ps"}}) == "dp_x_total{role=\"ps\"}".
std::string SeriesKey(const std::string& name,
                      const std::map<std::string, std::string>& labels = {});

// Every sample line of `text` (comments skipped) by SeriesKey. Lines that do
// not parse are returned under the key "!malformed: <line>".
std::map<std::string, double> ParseExposition(const std::string& text);

// The value of one series, if present.
std::optional<double> Sample(const std::map<std::string, double>& samples,
                             const std::string& name,
                             const std::map<std::string, std::string>& labels);

// GET http://host:port/path; the body when the status is 200, else an error
// naming the status line. Fails after `timeout`.
absl::StatusOr<std::string> HttpGet(const std::string& host, int port,
                                    const std::string& path,
                                    absl::Duration timeout = absl::Seconds(10));

// Whether this host can listen on ::1 (IPv6 may be disabled): the IPv6
// tests skip where it cannot.
bool HasIpv6Loopback();

}  // namespace dp

#endif  // DP_TESTS_EXPOSITION_H_
