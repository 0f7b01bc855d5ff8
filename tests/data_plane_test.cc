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

// A 40-step job whose ranks use `planes` ("shm" or "grpc"), with both ends
// of the step channels spinning before they sleep when `spin`, and the
// workers' `protocol`; the saved model. A worker over shared memory says
// its steps go through its step channel, unless the protocol is plain.
std::string Job(const TempDir& dir, const std::string& name,
                const std::vector<std::string>& planes, bool spin = false,
                const std::string& protocol = "fused") {
  const std::string model = dir.File(name);
  const std::string spin_flag = spin ? "--spin_us=300" : "--spin_us=0";
  int port = 0;
  auto ps = StartServer({"--workers=2", "--max_steps=40", "--batch_size=32",
                         "--seed=11", "--save_model=" + model, spin_flag},
                        &port);
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(StartWorker(port, r,
                                  {absl::StrCat("--data_plane=", planes[r]),
                                   spin_flag, "--protocol=" + protocol}));
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(workers[r]->Wait(kJobTimeout), 0) << workers[r]->output();
    const std::string path =
        planes[r] != "shm" ? "tensors through gRPC"
        : protocol == "fused"
            ? "tensors through shared memory, steps through step channels"
            : "tensors through shared memory, steps by gRPC calls";
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
  const std::string spinning =
      Job(dir, "spinning.safetensors", {"shm", "shm"}, /*spin=*/true);
  const std::string plain = Job(dir, "plain.safetensors", {"shm", "shm"},
                                /*spin=*/false, "plain");
  ASSERT_FALSE(grpc.empty());
  EXPECT_TRUE(shm == grpc);
  EXPECT_TRUE(mixed == grpc);
  EXPECT_TRUE(spinning == grpc);
  EXPECT_TRUE(plain == grpc);
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

// How often `text` occurs in `output`.
int Occurrences(const std::string& output, const std::string& text) {
  int n = 0;
  for (size_t at = output.find(text); at != std::string::npos;
       at = output.find(text, at + text.size())) {
    ++n;
  }
  return n;
}

// The model that `flags` (ending in --save_model=PATH) train on 2 workers on
// `plane` and `shards` shards, undisturbed; empty, with a failure, if the
// job failed.
std::string UndisturbedModel(const std::vector<std::string>& flags,
                             const std::vector<std::string>& on_plane,
                             int shards) {
  const JobResult undisturbed = RunJob(flags, 2, on_plane, shards);
  EXPECT_EQ(undisturbed.ps_exit, 0) << undisturbed.ps_output;
  if (undisturbed.ps_exit != 0) return "";
  return ReadModel(flags.back().substr(std::string("--save_model=").size()));
}

// A second process of rank 1 (a pod's replacement while the pod, on a
// partitioned node, still runs) stands by instead of taking the rank: the
// first never re-joins, and no dp-ps registers rank 1 again while the job
// makes 100 steps (with shards, the second asks only the leading one).
// kill -9 of the first closes its connection, and the second takes the
// rank then (the lease, 10 minutes, is far from running out), trains to
// the end and exits 0; the model is the undisturbed job's. Rank 0 is held
// with SIGSTOP (no backups: the step waits) while the second process
// starts and while the first is killed, so that the job cannot end first
// however fast it runs. Every worker on `plane`.
void ALingeringSecondProcessStandsBy(const std::string& plane, int shards) {
  const std::vector<std::string> on_plane = {"--data_plane=" + plane};
  TempDir dir;
  std::vector<std::string> flags = {
      "--max_steps=1000",      "--batch_size=32", "--dataset=synthetic",
      "--epochs=1000",         "--seed=11",       "--backup_blocks=0",
      "--worker_timeout_s=600"};
  flags.push_back("--save_model=" + dir.File("reference.safetensors"));
  const std::string reference = UndisturbedModel(flags, on_plane, 1);
  ASSERT_FALSE(reference.empty());

  const std::string model = dir.File("model.safetensors");
  flags.back() = "--save_model=" + model;
  flags.push_back("--workers=2");
  std::vector<int> ports;
  auto ps = StartShards(shards, flags, &ports);
  const int port = ports[0];
  const std::string list = PsList(ports);
  auto w0 = StartWorker(list, 0, on_plane);
  auto first = StartWorker(list, 1, on_plane);
  ASSERT_TRUE(WaitForStep(port, 5, absl::Minutes(2))) << ps[0]->output();
  w0->Signal(SIGSTOP);
  auto second = StartWorker(list, 1, on_plane);
  EXPECT_TRUE(second->WaitForOutput("rank 1 is held by a live process",
                                    absl::Minutes(2)))
      << second->output();
  w0->Signal(SIGCONT);
  const int64_t standing_by = CurrentStep(port);
  ASSERT_TRUE(WaitForStep(port, standing_by + 100, absl::Minutes(2)));
  w0->Signal(SIGSTOP);
  ASSERT_LT(CurrentStep(port), 1000) << "the job ended before the kill";
  for (auto& shard : ps) {
    EXPECT_EQ(Occurrences(shard->output(), "rank 1 registered"), 1)
        << shard->output();
  }
  EXPECT_EQ(Occurrences(second->output(), "joined at step"), 0)
      << second->output();

  first->Signal(SIGKILL);
  EXPECT_EQ(first->Wait(absl::Seconds(30)), 128 + SIGKILL);
  EXPECT_TRUE(second->WaitForOutput("rank 1: joined at step", absl::Minutes(2)))
      << second->output();
  w0->Signal(SIGCONT);
  EXPECT_EQ(second->Wait(kJobTimeout), 0) << second->output();
  EXPECT_EQ(second->output().find(" 0 steps here"), std::string::npos)
      << second->output();
  EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
  for (auto& shard : ps) EXPECT_EQ(shard->Wait(kJobTimeout), 0);
  // All told, with every output read to its end: no re-join, and (one
  // dp-ps) one registration of rank 1 by each process. With shards the
  // second may have asked the leader twice: another shard can see the
  // first's connection close a moment later.
  if (shards == 1) {
    EXPECT_EQ(Occurrences(ps[0]->output(), "rank 1 registered"), 2)
        << ps[0]->output();
  }
  EXPECT_EQ(Occurrences(first->output(), "re-joining"), 0) << first->output();
  EXPECT_EQ(Occurrences(second->output(), "joined at step"), 1)
      << second->output();
  EXPECT_EQ(Occurrences(second->output(), "re-joining"), 0) << second->output();
  EXPECT_TRUE(ReadModel(model) == reference)
      << "a second process of rank 1 changed the model";
}

TEST(DataPlaneTest, ALingeringSecondProcessOfARankStandsByOverSharedMemory) {
  ALingeringSecondProcessStandsBy("shm", 1);
}

TEST(DataPlaneTest, ALingeringSecondProcessOfARankStandsByOverGrpc) {
  ALingeringSecondProcessStandsBy("grpc", 1);
}

TEST(DataPlaneTest, ALingeringSecondProcessOfARankStandsByWithShards) {
  ALingeringSecondProcessStandsBy("auto", 2);
}

// A worker whose block another computed (a straggler backup) while it was
// away, and that finds the job steps ahead when it comes back, moves on to
// the newest version without registering again: rank 0 is held with
// SIGSTOP while rank 1 backs up its block and then runs on alone, then let
// go. Its gradient of the old step counts for nothing (the model is the
// undisturbed job's), and dp-ps registered it once.
void ABackedUpWorkerMovesOnWithoutRegisteringAgain(const std::string& plane,
                                                   int shards) {
  const std::vector<std::string> on_plane = {"--data_plane=" + plane};
  TempDir dir;
  std::vector<std::string> flags = {"--max_steps=400",
                                    "--batch_size=32",
                                    "--dataset=synthetic",
                                    "--epochs=1000",
                                    "--seed=11",
                                    "--backup_blocks=1",
                                    "--worker_timeout_s=600",
                                    "--straggler_min_wait_ms=1"};
  flags.push_back("--save_model=" + dir.File("reference.safetensors"));
  const std::string reference = UndisturbedModel(flags, on_plane, shards);
  ASSERT_FALSE(reference.empty());

  const std::string model = dir.File("model.safetensors");
  flags.back() = "--save_model=" + model;
  flags.push_back("--workers=2");
  std::vector<int> ports;
  auto ps = StartShards(shards, flags, &ports);
  const int port = ports[0];
  auto w0 = StartWorker(PsList(ports), 0, on_plane);
  auto w1 = StartWorker(PsList(ports), 1, on_plane);
  ASSERT_TRUE(WaitForStep(port, 5, absl::Minutes(2))) << ps[0]->output();
  w0->Signal(SIGSTOP);
  const int64_t held_at = CurrentStep(port);
  ASSERT_TRUE(WaitForStep(port, held_at + 10, absl::Minutes(2)))
      << ps[0]->output();
  ASSERT_LT(CurrentStep(port), 400) << "the job ended while rank 0 was held";
  w0->Signal(SIGCONT);
  EXPECT_EQ(w0->Wait(kJobTimeout), 0) << w0->output();
  EXPECT_EQ(w1->Wait(kJobTimeout), 0) << w1->output();
  for (auto& shard : ps) {
    EXPECT_EQ(shard->Wait(kJobTimeout), 0) << shard->output();
    EXPECT_EQ(Occurrences(shard->output(), "rank 0 registered"), 1)
        << shard->output();
  }
  EXPECT_EQ(Occurrences(w0->output(), "re-joining"), 0) << w0->output();
  EXPECT_NE(w0->output().find("rank 0: moving on from step"), std::string::npos)
      << w0->output();
  EXPECT_TRUE(ReadModel(model) == reference)
      << "a backed-up block changed the model";
}

TEST(DataPlaneTest,
     ABackedUpWorkerMovesOnWithoutRegisteringAgainOverSharedMemory) {
  ABackedUpWorkerMovesOnWithoutRegisteringAgain("shm", 1);
}

TEST(DataPlaneTest, ABackedUpWorkerMovesOnWithoutRegisteringAgainOverGrpc) {
  ABackedUpWorkerMovesOnWithoutRegisteringAgain("grpc", 1);
}

TEST(DataPlaneTest, ABackedUpWorkerMovesOnWithoutRegisteringAgainWithShards) {
  ABackedUpWorkerMovesOnWithoutRegisteringAgain("auto", 2);
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
