// A checkpoint volume that fills up mid-job, seen on the real /metrics of a
// real dp-ps: the failures are counted while training goes on, the newest
// checkpoint's step stays where it was, and once there is room again the
// next checkpoint lands and verifies. Needs root (tmpfs mounts); skipped
// where mounting is not allowed.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/flags.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"
#include "tests/exposition.h"
#include "tests/job_runner.h"

namespace dp {
namespace {

constexpr int64_t kEvery = 20;  // --checkpoint_every
const absl::Duration kTimeout = absl::Minutes(2);
const std::map<std::string, std::string> kPs = {{"role", "ps"}, {"shard", "0"}};

// Moves this process, and the processes it starts from now on, into a mount
// namespace of their own whose mounts do not propagate to the host's: the
// test's mounts disappear with its last process, however it ends.
absl::Status OwnMountNamespace() {
  if (::unshare(CLONE_NEWNS) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("unshare(CLONE_NEWNS): ", std::strerror(errno)));
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("making / private: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// A tmpfs of `size` bytes mounted on `dir` (over whatever is there) until
// Unmount or destruction.
class Tmpfs {
 public:
  Tmpfs(std::string dir, int64_t size) : dir_(std::move(dir)) {
    const std::string options = absl::StrCat("size=", size);
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      status_ =
          absl::InternalError(absl::StrCat("mount -t tmpfs -o ", options, " ",
                                           dir_, ": ", std::strerror(errno)));
    }
  }
  ~Tmpfs() {
    // Detached even while a process still uses it: a failed test must not
    // leave the mount behind.
    if (status_.ok()) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  const absl::Status& status() const { return status_; }
  absl::Status Unmount() {
    if (!status_.ok()) return status_;
    if (::umount(dir_.c_str()) != 0) {
      return absl::InternalError(
          absl::StrCat("umount ", dir_, ": ", std::strerror(errno)));
    }
    status_ = absl::CancelledError("unmounted");
    return absl::OkStatus();
  }

 private:
  const std::string dir_;
  absl::Status status_;
};

// Writes `path` until the file system has no byte left (ENOSPC).
absl::Status FillUp(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  const std::string chunk(1 << 16, 'x');
  int e = 0;
  while (e == 0) {
    if (::write(fd, chunk.data(), chunk.size()) < 0) e = errno;
  }
  ::close(fd);
  if (e != ENOSPC) {
    return absl::InternalError(
        absl::StrCat("filling ", path, ": ", std::strerror(e)));
  }
  return absl::OkStatus();
}

int MetricsPort(const Subprocess& ps) {
  int port = 0;
  auto field = ps.Field("metrics on 127.0.0.1:");
  if (!field.has_value() || !absl::SimpleAtoi(*field, &port)) port = 0;
  return port;
}

// What one scrape of dp-ps's /metrics says about its checkpoints; -1 for a
// series that is missing (or a scrape that failed).
struct Seen {
  int64_t training_step = -1;
  int64_t checkpoint_step = -1;
  int64_t failures = -1;
};

Seen Scrape(int port) {
  Seen seen;
  absl::StatusOr<std::string> text = HttpGet("127.0.0.1", port, "/metrics");
  if (!text.ok()) return seen;
  const auto s = ParseExposition(*text);
  auto get = [&s](const char* name) -> int64_t {
    const std::optional<double> v = Sample(s, name, kPs);
    return v.has_value() ? static_cast<int64_t>(*v) : -1;
  };
  seen.training_step = get("dp_training_step");
  seen.checkpoint_step = get("dp_ps_checkpoint_step");
  seen.failures = get("dp_ps_checkpoint_write_failures_total");
  return seen;
}

std::string Describe(const Seen& s) {
  return absl::StrCat("step ", s.training_step, ", checkpoint step ",
                      s.checkpoint_step, ", write failures ", s.failures);
}

// Polls the metrics until `done` holds of a scrape; that scrape, or a
// test failure naming `what` and the last scrape.
Seen AwaitScrape(int port, const std::string& what,
                 const std::function<bool(const Seen&)>& done) {
  Seen last;
  if (!PollUntil(
          [&] {
            last = Scrape(port);
            return done(last);
          },
          kTimeout)) {
    ADD_FAILURE() << "no scrape showed " << what
                  << "; the last: " << Describe(last);
  }
  return last;
}

// The steps of the checkpoint files in `dir`, newest first.
std::vector<int64_t> CheckpointSteps(const std::string& dir) {
  std::vector<int64_t> steps;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string file = e.path().filename().string();
    absl::string_view name = file;
    int64_t step;
    if (absl::ConsumePrefix(&name, "ckpt-") &&
        absl::ConsumeSuffix(&name, ".dpckpt") &&
        absl::SimpleAtoi(name, &step)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// The volume fills up by a full tmpfs mounted over the checkpoint
// directory: from then on every file dp-ps creates there lands on it. (Filling
// the job's own volume instead would race with the checkpoint being
// written: one that still succeeds removes the oldest, and the next fits in
// the room it left.) Removing the filler gives the room back, on the same
// mount.
TEST(CheckpointVolumeTest, FullVolumeIsCountedTrainingGoesOnThenTheNextLands) {
  if (absl::Status s = OwnMountNamespace(); !s.ok()) {
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << s;
  }
  TempDir dir;
  const std::string ckpt = dir.File("ckpt");
  ASSERT_EQ(::mkdir(ckpt.c_str(), 0755), 0) << std::strerror(errno);
  // A SimpleNet checkpoint is 2.8 MB: room for the 2 kept and one being
  // written, on the job's volume and on the one that fills up.
  constexpr int64_t kRoom = int64_t{16} << 20;
  Tmpfs volume(ckpt, kRoom);
  ASSERT_TRUE(volume.status().ok()) << volume.status();

  int port = 0;
  auto ps =
      StartServer({"--workers=1", "--max_steps=100000000", "--batch_size=16",
                   "--seed=5", absl::StrCat("--checkpoint_every=", kEvery),
                   "--keep_checkpoints=2", "--checkpoint_dir=" + ckpt,
                   "--metrics_port=-1", "--metrics_host=127.0.0.1"},
                  &port);
  const int metrics = MetricsPort(*ps);
  ASSERT_GT(metrics, 0) << ps->output();
  Seen s = Scrape(metrics);
  EXPECT_EQ(s.checkpoint_step, 0) << Describe(s);  // none yet
  EXPECT_EQ(s.failures, 0) << Describe(s);
  auto worker = StartWorker(port, 0);

  // 1. Checkpoints land on the job's volume.
  s = AwaitScrape(metrics, "a first checkpoint",
                  [](const Seen& s) { return s.checkpoint_step >= kEvery; });
  EXPECT_EQ(s.failures, 0) << Describe(s);

  // 2. The volume is full: writes fail, counted; training goes on.
  Tmpfs full(ckpt, kRoom);
  ASSERT_TRUE(full.status().ok()) << full.status();
  const std::string filler = ckpt + "/filler";
  ASSERT_TRUE(FillUp(filler).ok());
  const int64_t full_at = CurrentStep(port);
  ASSERT_GE(full_at, kEvery);
  s = AwaitScrape(metrics, "two failed checkpoint writes",
                  [](const Seen& s) { return s.failures >= 2; });
  ASSERT_TRUE(WaitForStep(port, full_at + 3 * kEvery, kTimeout))
      << "training stopped while the checkpoints failed\n"
      << ps->output();
  s = Scrape(metrics);
  EXPECT_GE(s.training_step, full_at + 3 * kEvery) << Describe(s);
  // Nothing written since the volume filled up (a write in progress then
  // may have finished, of a step before it).
  EXPECT_LE(s.checkpoint_step, full_at) << Describe(s);
  EXPECT_GE(s.failures, 2) << Describe(s);
  EXPECT_TRUE(absl::StrContains(ps->output(), "No space left on device"))
      << ps->output();
  const Seen while_full = s;

  // 3. Room again: the next checkpoint lands, newer than any step trained
  // while the volume was full.
  ASSERT_EQ(::unlink(filler.c_str()), 0) << std::strerror(errno);
  s = AwaitScrape(metrics, "a checkpoint once there was room",
                  [&while_full](const Seen& s) {
                    return s.checkpoint_step > while_full.training_step;
                  });
  // The newest file there, read back and verified. One landing meanwhile
  // may remove it (2 are kept) between the listing and the read: then the
  // listing is taken again.
  CheckpointStore store(ckpt, ModelLayout::SimpleNet(), 2);
  int64_t newest = -1;
  absl::Status read = absl::NotFoundError("no checkpoint file");
  ASSERT_TRUE(PollUntil(
      [&] {
        const std::vector<int64_t> steps = CheckpointSteps(ckpt);
        if (steps.empty()) return false;
        newest = steps.front();
        read = store.Load(newest).status();
        return read.code() != absl::StatusCode::kNotFound;
      },
      kTimeout))
      << read;
  EXPECT_TRUE(read.ok()) << read;
  EXPECT_GE(newest, s.checkpoint_step);

  // 4. Stopped, dp-ps writes its final checkpoint there too (exit 3, not
  // the exit 1 of a stop whose checkpoint failed).
  worker->Signal(SIGTERM);
  EXPECT_EQ(worker->Wait(kTimeout), kExitInterrupted) << worker->output();
  ps->Signal(SIGTERM);
  EXPECT_EQ(ps->Wait(kTimeout), kExitInterrupted) << ps->output();
  const std::vector<int64_t> after_stop = CheckpointSteps(ckpt);
  ASSERT_FALSE(after_stop.empty());
  const int64_t final_step = after_stop.front();
  EXPECT_GE(final_step, newest);
  absl::StatusOr<Checkpoint> final_checkpoint = store.Load(final_step);
  EXPECT_TRUE(final_checkpoint.ok()) << final_checkpoint.status();
  EXPECT_TRUE(absl::StrContains(
      ps->output(),
      absl::StrCat("checkpoint of step ", final_step, " written")))
      << ps->output();
  std::printf(
      "full at step %lld: %lld failed writes by step %lld; room again, "
      "checkpoint of step %lld; final checkpoint of step %lld\n",
      static_cast<long long>(full_at),
      static_cast<long long>(while_full.failures),
      static_cast<long long>(while_full.training_step),
      static_cast<long long>(s.checkpoint_step),
      static_cast<long long>(final_step));
  EXPECT_TRUE(full.Unmount().ok());
  EXPECT_TRUE(volume.Unmount().ok());
}

}  // namespace
}  // namespace dp
