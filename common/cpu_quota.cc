// The cgroup's CPU quota, read the way the Go runtime and the JVM read it.
#include "common/cpu_quota.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"

namespace dp {
namespace {

// CPUs from a quota and period in microseconds; nullopt for no limit.
std::optional<double> Cpus(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return std::nullopt;
  return static_cast<double>(quota) / static_cast<double>(period);
}

// v2: "150000 100000", or "max 100000".
std::optional<double> ReadCpuMax(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFile(dir + "/cpu.max");
  if (!text.ok()) return std::nullopt;
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ');
  int64_t quota = 0, period = 0;
  if (fields.size() != 2 || !absl::SimpleAtoi(fields[0], &quota) ||
      !absl::SimpleAtoi(fields[1], &period)) {
    return std::nullopt;  // "max": no limit at this level
  }
  return Cpus(quota, period);
}

// v1: cpu.cfs_quota_us (-1: no limit) and cpu.cfs_period_us.
std::optional<double> ReadCfsQuota(const std::string& dir) {
  absl::StatusOr<std::string> quota_text = ReadFile(dir + "/cpu.cfs_quota_us");
  absl::StatusOr<std::string> period_text =
      ReadFile(dir + "/cpu.cfs_period_us");
  int64_t quota = 0, period = 0;
  if (!quota_text.ok() || !period_text.ok() ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(*quota_text), &quota) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(*period_text), &period)) {
    return std::nullopt;
  }
  return Cpus(quota, period);
}

// The smallest limit from `mount`/`path` up to `mount`: a parent's limit
// binds its children too.
template <typename Read>
std::optional<double> SmallestAlongPath(const std::string& mount,
                                        std::string path, Read read) {
  std::optional<double> smallest;
  for (;;) {
    const std::optional<double> here = read(mount + path);
    if (here.has_value() && (!smallest.has_value() || *here < *smallest)) {
      smallest = here;
    }
    if (path.empty() || path == "/") return smallest;
    const size_t slash = path.rfind('/');
    path = slash == std::string::npos ? "" : path.substr(0, slash);
  }
}

}  // namespace

std::optional<double> CgroupCpuLimit(const std::string& cgroup_root,
                                     absl::string_view proc_self_cgroup) {
  std::optional<double> v2, v1;
  for (absl::string_view line :
       absl::StrSplit(proc_self_cgroup, '\n', absl::SkipWhitespace())) {
    // "hierarchy-id:controllers:path"; the path may itself hold ':'.
    std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    const std::string path(absl::StripSuffix(parts[2], "/"));
    if (parts[0] == "0" && parts[1].empty()) {
      v2 = SmallestAlongPath(cgroup_root, path, ReadCpuMax);
      continue;
    }
    for (absl::string_view controller : absl::StrSplit(parts[1], ',')) {
      if (controller != "cpu") continue;
      // Mounted as the list of its controllers ("cpu,cpuacct"), often with a
      // "cpu" link to it.
      for (const std::string dir :
           {std::string(parts[1]), std::string("cpu")}) {
        v1 = SmallestAlongPath(cgroup_root + "/" + dir, path, ReadCfsQuota);
        if (v1.has_value()) break;
      }
    }
  }
  // A host with both mounted (hybrid): the v2 tree holds no cpu controller
  // then, and only v1 says anything.
  return v2.has_value() ? v2 : v1;
}

int UsableCpus() {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  absl::StatusOr<std::string> cgroup = ReadFile("/proc/self/cgroup");
  if (cgroup.ok()) {
    if (std::optional<double> limit = CgroupCpuLimit("/sys/fs/cgroup", *cgroup);
        limit.has_value()) {
      cpus = std::min(cpus, static_cast<int>(std::ceil(*limit)));
    }
  }
  return std::max(cpus, 1);
}

}  // namespace dp
