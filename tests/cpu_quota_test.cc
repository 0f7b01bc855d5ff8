// The cgroup CPU limit on fake cgroup trees: v2 cpu.max and v1 CFS quota,
// nested levels, a container's own cgroup seen as the root, no limit.
#include "common/cpu_quota.h"

#include <filesystem>
#include <thread>

#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"

namespace dp {
namespace {

// Writes `text` to `root`/`file`, creating the folders.
void Put(const TempDir& root, const std::string& file,
         const std::string& text) {
  const std::filesystem::path path = root.File(file);
  std::filesystem::create_directories(path.parent_path());
  ASSERT_TRUE(WriteFileAtomic(path, text).ok()) << path;
}

TEST(CpuQuotaTest, CgroupV2CpuMaxOfTheProcessCgroup) {
  TempDir root;
  Put(root, "cpu.max", "100000 100000\n");  // a container's own, at the root
  EXPECT_EQ(CgroupCpuLimit(root.path(), "0::/\n"), 1.0);
  Put(root, "kubepods/pod1/ctr/cpu.max", "150000 100000\n");
  Put(root, "kubepods/pod1/cpu.max", "max 100000\n");
  EXPECT_EQ(CgroupCpuLimit(root.path(), "0::/kubepods/pod1/ctr\n"), 1.0);
  Put(root, "cpu.max", "max 100000\n");
  EXPECT_EQ(CgroupCpuLimit(root.path(), "0::/kubepods/pod1/ctr\n"), 1.5);
}

TEST(CpuQuotaTest, AParentsSmallerLimitBindsTheChild) {
  TempDir root;
  Put(root, "a/b/cpu.max", "400000 100000\n");
  Put(root, "a/cpu.max", "50000 100000\n");
  EXPECT_EQ(CgroupCpuLimit(root.path(), "0::/a/b\n"), 0.5);
}

TEST(CpuQuotaTest, CgroupV1CfsQuotaUnderTheCpuController) {
  TempDir root;
  const std::string cgroup =
      "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n";
  Put(root, "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "200000\n");
  Put(root, "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuLimit(root.path(), cgroup), 2.0);
  Put(root, "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");
  EXPECT_EQ(CgroupCpuLimit(root.path(), cgroup), std::nullopt);
}

// Inside a container the host's path in /proc/self/cgroup is not in the
// mount: the container's cgroup is the mount's root.
TEST(CpuQuotaTest, APathNotInTheMountFindsTheLimitAtItsRoot) {
  TempDir root;
  Put(root, "cpu/cpu.cfs_quota_us", "50000\n");
  Put(root, "cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuLimit(root.path(), "3:cpu:/kubepods/burstable/pod9/c\n"),
            0.5);
  TempDir v2;
  Put(v2, "cpu.max", "300000 100000\n");
  EXPECT_EQ(CgroupCpuLimit(v2.path(), "0::/kubepods/pod9/c\n"), 3.0);
}

TEST(CpuQuotaTest, NoLimitOrNothingReadableIsNone) {
  TempDir root;
  EXPECT_EQ(CgroupCpuLimit(root.path(), "0::/\n"), std::nullopt);
  EXPECT_EQ(CgroupCpuLimit(root.path(), ""), std::nullopt);
  Put(root, "cpu.max", "max 100000\n");
  EXPECT_EQ(CgroupCpuLimit(root.path(), "0::/\n"), std::nullopt);
  Put(root, "cpu.max", "garbage\n");
  EXPECT_EQ(CgroupCpuLimit(root.path(), "0::/\n"), std::nullopt);
  Put(root, "cpu.max", "0 100000\n");
  EXPECT_EQ(CgroupCpuLimit(root.path(), "0::/\n"), std::nullopt);
  EXPECT_EQ(CgroupCpuLimit(root.path(), "not a cgroup line\n"), std::nullopt);
}

TEST(CpuQuotaTest, UsableCpusIsBetweenOneAndTheMachinesCount) {
  const int cpus = UsableCpus();
  EXPECT_GE(cpus, 1);
  EXPECT_LE(cpus, static_cast<int>(
                      std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace dp
