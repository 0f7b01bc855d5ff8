// How many CPUs this process may keep busy: the CPUs it may run on, lowered
// to its cgroup's CPU quota (a container's CPU limit), as the Go runtime and
// the JVM size their thread pools.
#ifndef DP_COMMON_CPU_QUOTA_H_
#define DP_COMMON_CPU_QUOTA_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace dp {

// The CPU limit of a process's cgroup, in CPUs (1.5 for a quota of 150000
// per period of 100000): the smallest one along its cgroup's path, from
// `cgroup_root` (where cgroupfs is mounted, normally /sys/fs/cgroup) and
// `proc_self_cgroup` (the text of its /proc/self/cgroup). cgroup v2 reads
// cpu.max ("max" is no limit); v1 reads cpu.cfs_quota_us (-1 is no limit)
// and cpu.cfs_period_us under the cpu controller's directory. A path that
// is not there (a container sees its own cgroup as the root) is looked up
// level by level towards the root. nullopt when no level sets a limit or
// nothing can be read.
std::optional<double> CgroupCpuLimit(const std::string& cgroup_root,
                                     absl::string_view proc_self_cgroup);

// The CPUs this process may run on (its affinity mask), lowered to the
// cgroup's limit rounded up; at least 1.
int UsableCpus();

}  // namespace dp

#endif  // DP_COMMON_CPU_QUOTA_H_
