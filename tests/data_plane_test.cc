// The two data planes with real processes: shared memory for workers on
// dp-ps's host, gRPC for the others, in one job if need be, with the same
// model to the byte; and the shared-memory path's own defences.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "gtest/gtest.h"
#include "tests/job_runner.h"
#include "tests/subprocess.h"

namespace dp {
namespace {

// The shared memory process `pid` holds, as /proc names it: its open
// descriptors' targets and its mappings' paths that are memfds
// ("/memfd:...") or files on /dev/shm. Read from the process itself, so
// that what other programs on the host put in /dev/shm meanwhile does not
// count.
std::vector<std::string> SharedMemoryOf(pid_t pid) {
  std::vector<std::string> found;
  auto note = [&](const std::string& target) {
    if (target.rfind("/memfd:", 0) == 0 || target.rfind("/dev/shm/", 0) == 0) {
      found.push_back(target);
    }
  };
  const std::string fds = absl::StrCat("/proc/", pid, "/fd");
  if (DIR* d = opendir(fds.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[4096];
      const std::string link = fds + "/" + e->d_name;
      const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      if (n > 0) note(std::string(target, n));
    }
    closedir(d);
  }
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash != std::string::npos) note(line.substr(slash));
  }
  return found;
}

// A 40-step job whose ranks use `planes` ("shm" or "grpc"); the saved model.
std::string Job(const TempDir& dir, const std::string& name,
                const std::vector<std::string>& planes) {
  const std::string model = dir.File(name);
  int port = 0;
  auto ps = StartServer({"--workers=2", "--max_steps=40", "--batch_size=32",
                         "--seed=11", "--save_model=" + model},
                        &port);
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(
        StartWorker(port, r, {absl::StrCat("--data_plane=", planes[r])}));
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(workers[r]->Wait(kJobTimeout), 0) << workers[r]->output();
    const std::string path = planes[r] == "shm"
                                 ? "tensors through shared memory"
                                 : "tensors through gRPC";
    EXPECT_NE(workers[r]->output().find(path), std::string::npos)
        << workers[r]->output();
  }
  EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
  return ReadModel(model);
}

TEST(DataPlaneTest, EveryMixOfPathsTrainsTheSameModelToTheByte) {
  TempDir dir;
  const std::string grpc = Job(dir, "grpc.safetensors", {"grpc", "grpc"});
  const std::string shm = Job(dir, "shm.safetensors", {"shm", "shm"});
  const std::string mixed = Job(dir, "mixed.safetensors", {"shm", "grpc"});
  ASSERT_FALSE(grpc.empty());
  EXPECT_TRUE(shm == grpc);
  EXPECT_TRUE(mixed == grpc);
}

TEST(DataPlaneTest, ForcedSharedMemoryWithoutAnOfferIsAConfigurationError) {
  int port = 0;
  auto ps = StartServer({"--workers=1", "--max_steps=5", "--batch_size=16",
                         "--shared_memory=false"},
                        &port);
  auto w = StartWorker(port, 0, {"--data_plane=shm", "--retry_for_s=5"});
  EXPECT_EQ(w->Wait(kJobTimeout), kExitConfigError) << w->output();
  EXPECT_NE(w->output().find("--data_plane=shm: dp-ps offers no shared memory"),
            std::string::npos)
      << w->output();
  // The same worker on auto trains over gRPC.
  auto auto_worker = StartWorker(port, 0);
  EXPECT_EQ(auto_worker->Wait(kJobTimeout), 0) << auto_worker->output();
  EXPECT_NE(
      auto_worker->output().find("tensors through gRPC (no shared memory"),
      std::string::npos)
      << auto_worker->output();
  EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
}

// A 600-step job over shared memory; with `lingering`, a second process of
// rank 0 (a restarted pod whose predecessor still runs) joins at step 5 and
// both run to the end. The saved model.
std::string JobWithLingeringRank(const TempDir& dir, const std::string& name,
                                 bool lingering) {
  const std::string model = dir.File(name);
  int port = 0;
  auto ps = StartServer({"--workers=2", "--max_steps=600", "--batch_size=32",
                         "--dataset=synthetic", "--epochs=1000", "--seed=11",
                         "--save_model=" + model},
                        &port);
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(StartWorker(port, r, {"--data_plane=shm"}));
  }
  if (lingering) {
    EXPECT_TRUE(WaitForStep(port, 5, absl::Minutes(2))) << ps->output();
    workers.push_back(StartWorker(port, 0, {"--data_plane=shm"}));
    EXPECT_TRUE(workers.back()->WaitForOutput("tensors through shared memory",
                                              absl::Minutes(2)))
        << workers.back()->output();
    EXPECT_LT(CurrentStep(port), 550) << "the job ended before both ran";
  }
  EXPECT_EQ(workers[1]->Wait(kJobTimeout), 0) << workers[1]->output();
  for (auto& w : workers) EXPECT_TRUE(w->Wait(kJobTimeout).has_value());
  EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
  return ReadModel(model);
}

// The older process's pushes name a slot that is no longer its, and are
// refused rather than read from the newer process's slot (zeros, the last
// step's gradient, or half written): the model is the undisturbed job's.
TEST(DataPlaneTest, ALingeringSecondProcessOfARankLeavesTheModelAsItWas) {
  TempDir dir;
  const std::string reference =
      JobWithLingeringRank(dir, "reference.safetensors", false);
  ASSERT_FALSE(reference.empty());
  const std::string lingering =
      JobWithLingeringRank(dir, "lingering.safetensors", true);
  EXPECT_TRUE(lingering == reference)
      << "two processes of rank 0 changed the model";
}

// Shared memory has no name: kill -9 of every process leaves nothing that
// a restarted dp-ps or anyone else could find (and trust).
TEST(DataPlaneTest, KilledProcessesLeaveNoSharedMemoryBehind) {
  int port = 0;
  auto ps = StartServer(
      {"--workers=2", "--max_steps=100000", "--batch_size=16"}, &port);
  auto w0 = StartWorker(port, 0, {"--data_plane=shm"});
  auto w1 = StartWorker(port, 1, {"--data_plane=shm"});
  ASSERT_TRUE(WaitForStep(port, 10, absl::Minutes(2)));
  // Every process's shared memory is a memfd, which dies with the last
  // process holding it: none is a name in /dev/shm that would outlive them.
  for (Subprocess* p : {ps.get(), w0.get(), w1.get()}) {
    const std::vector<std::string> held = SharedMemoryOf(p->pid());
    EXPECT_FALSE(held.empty()) << "pid " << p->pid() << " holds no memfd";
    for (const std::string& name : held) {
      EXPECT_EQ(name.rfind("/memfd:", 0), 0u)
          << "pid " << p->pid() << ": " << name;
    }
  }
  for (Subprocess* p : {ps.get(), w0.get(), w1.get()}) p->Signal(SIGKILL);
  for (Subprocess* p : {ps.get(), w0.get(), w1.get()}) {
    EXPECT_EQ(p->Wait(absl::Seconds(30)), 128 + SIGKILL);
  }
}

}  // namespace
}  // namespace dp
