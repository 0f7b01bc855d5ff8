// Shared memory between dp-ps and its workers: regions, the read-only
// weights, the one-time handover, and the sequence-locked weights.
#include "common/shared_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dp {
namespace {

constexpr uid_t kNobody = 65534;

int OpenDescriptors() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// Drops this (child) process's privileges to `uid`: false if it cannot.
bool BecomeUser(uid_t uid) {
  return setgroups(0, nullptr) == 0 && setgid(uid) == 0 && setuid(uid) == 0;
}

// Everything written to `fd` until its writers close it; closes it.
std::string ReadAll(int fd) {
  std::string all;
  char buf[256];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) all.append(buf, n);
  close(fd);
  return all;
}

// Runs `body` in a child process as `uid` (when root can switch to it) and
// returns what it reported: "" when every check held, else the first that
// failed. The child keeps /proc/self/fd open to itself (dumpable), as a
// worker started as that user is.
std::string InChildAs(uid_t uid, const std::function<std::string()>& body) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return "pipe failed";
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipe_fds[0]);
    std::string verdict;
    if (uid != geteuid() && !BecomeUser(uid)) {
      verdict = "could not switch user";
    } else {
      prctl(PR_SET_DUMPABLE, 1);
      verdict = body();
    }
    if (write(pipe_fds[1], verdict.data(), verdict.size()) < 0) _exit(2);
    _exit(0);
  }
  close(pipe_fds[1]);
  const std::string verdict = ReadAll(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "child crashed";
  return verdict;
}

// What a worker of dp-ps's own user can do with the weights it was handed
// read-only: not map them for writing, not reopen them writable through
// /proc, not write, not resize.
std::string TryToWriteTheWeights() {
  auto region =
      SharedRegion::Create("weights", 4096, SharedRegion::Peers::kReadOnly);
  if (!region.ok()) return region.status().ToString();
  std::memset((*region)->data(), 7, 4096);
  absl::StatusOr<int> ro = (*region)->ReadOnlyDescriptor();
  if (!ro.ok()) return ro.status().ToString();
  void* w = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, *ro, 0);
  if (w != MAP_FAILED) return "the read-only descriptor mapped writable";
  if (ftruncate(*ro, 0) == 0) return "the read-only descriptor truncated it";
  const int rw =
      open(absl::StrCat("/proc/self/fd/", *ro).c_str(), O_RDWR | O_CLOEXEC);
  if (rw >= 0) {
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
    if (p != MAP_FAILED) return "reopened through /proc and mapped writable";
    const char byte = 1;
    if (pwrite(rw, &byte, 1, 0) == 1) return "reopened and written";
    if (ftruncate(rw, 0) == 0) return "reopened and truncated";
    close(rw);
  }
  auto mapped = SharedRegion::Map(*ro, 4096, /*writable=*/false);
  if (!mapped.ok()) return mapped.status().ToString();
  if ((*mapped)->data()[4095] != 7) return "not the same memory";
  void* upgraded = (*mapped)->data();
  if (mprotect(upgraded, 4096, PROT_READ | PROT_WRITE) == 0) {
    return "the read-only mapping was made writable";
  }
  return "";
}

TEST(SharedMemoryTest, AReadOnlyDescriptorCannotBeMappedForWriting) {
  EXPECT_EQ(InChildAs(geteuid(), TryToWriteTheWeights), "");
}

TEST(SharedMemoryTest, ANonRootWorkerCannotWriteTheWeightsEither) {
  if (geteuid() != 0) {
    EXPECT_EQ(InChildAs(geteuid(), TryToWriteTheWeights), "");
    GTEST_SKIP() << "running as a non-root user: checked above as that user";
  }
  // dp-ps and its worker both as an unprivileged user.
  EXPECT_EQ(InChildAs(kNobody, TryToWriteTheWeights), "");
}

// Only a process of dp-ps's own user gets the memory, whoever dp-ps is:
// a dp-ps running as root hands it to root alone.
TEST(SharedMemoryTest, AnotherUserGetsNothingEvenFromARootDpPs) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  auto offer = SharedMemoryOffer::Start();
  ASSERT_TRUE(offer.ok()) << offer.status();
  auto region = SharedRegion::Create("test", 4096);
  ASSERT_TRUE(region.ok());
  const std::string ticket = (*offer)->IssueTicket(0, {dup((*region)->fd())});
  const std::string socket = (*offer)->socket_name();
  EXPECT_EQ(InChildAs(kNobody,
                      [&]() -> std::string {
                        auto fds = FetchSharedMemory(socket, ticket, 1);
                        if (fds.ok()) return "another user got the memory";
                        return "";
                      }),
            "");
  auto fds = FetchSharedMemory(socket, ticket, 1);
  ASSERT_TRUE(fds.ok()) << "the stranger used up the ticket: " << fds.status();
  for (int fd : *fds) close(fd);
}

// ... and a non-root dp-ps hands it to no one else, root included: root
// can read any process's memory anyway, but not through dp-ps's handover.
TEST(SharedMemoryTest, ANonRootDpPsHandsNothingToRoot) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t pid = fork();
  if (pid == 0) {  // dp-ps, as an unprivileged user
    close(to_parent[0]);
    close(to_child[1]);
    if (!BecomeUser(kNobody)) _exit(2);
    auto offer = SharedMemoryOffer::Start();
    auto region = SharedRegion::Create("test", 4096);
    if (!offer.ok() || !region.ok()) _exit(3);
    const std::string ticket = (*offer)->IssueTicket(0, {dup((*region)->fd())});
    const std::string line = (*offer)->socket_name() + " " + ticket;
    if (write(to_parent[1], line.data(), line.size()) < 0) _exit(4);
    close(to_parent[1]);
    char done;
    (void)!read(to_child[0], &done, 1);  // until the parent has tried
    _exit((*offer)->outstanding_tickets() == 1 ? 0 : 5);
  }
  close(to_parent[1]);
  close(to_child[0]);
  const std::string line = ReadAll(to_parent[0]);
  const size_t space = line.find(' ');
  ASSERT_NE(space, std::string::npos) << "the child did not start: " << line;
  auto fds =
      FetchSharedMemory(line.substr(0, space), line.substr(space + 1), 1);
  EXPECT_EQ(fds.status().code(), absl::StatusCode::kPermissionDenied)
      << "root got the memory of a non-root dp-ps";
  if (fds.ok()) {
    for (int fd : *fds) close(fd);
  }
  close(to_child[1]);  // the child's read returns
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the ticket was used up by the refused peer (or the child failed: "
      << status << ")";
}

// A local process that connects and sends nothing (or many such) does not
// hold up the workers' handovers.
TEST(SharedMemoryTest, IdleConnectionsDoNotStallTheHandover) {
  auto offer = SharedMemoryOffer::Start();
  ASSERT_TRUE(offer.ok()) << offer.status();
  auto region = SharedRegion::Create("test", 4096);
  ASSERT_TRUE(region.ok());
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string& name = (*offer)->socket_name();
    std::memcpy(addr.sun_path + 1, name.data(), name.size());
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr),
                      offsetof(sockaddr_un, sun_path) + 1 + name.size()),
              0);
    idle.push_back(fd);
  }
  // Each idle connection held the old one-at-a-time handover for 2 s: four
  // of them outlast the worker's 5 s.
  const std::string ticket = (*offer)->IssueTicket(0, {dup((*region)->fd())});
  auto fds = FetchSharedMemory((*offer)->socket_name(), ticket, 1);
  EXPECT_TRUE(fds.ok()) << fds.status();
  if (fds.ok()) {
    for (int fd : *fds) close(fd);
  }
  for (int fd : idle) close(fd);
}

TEST(SharedMemoryTest, ATicketHandsTheDescriptorsOverOnceAndOnlyOnce) {
  auto offer = SharedMemoryOffer::Start();
  ASSERT_TRUE(offer.ok()) << offer.status();
  auto region = SharedRegion::Create("test", 4096);
  ASSERT_TRUE(region.ok());
  (*region)->data()[0] = 42;
  const std::string ticket = (*offer)->IssueTicket(0, {dup((*region)->fd())});
  auto fds = FetchSharedMemory((*offer)->socket_name(), ticket, 1);
  ASSERT_TRUE(fds.ok()) << fds.status();
  ASSERT_EQ(fds->size(), 1u);
  auto mapped = SharedRegion::Map((*fds)[0], 4096, /*writable=*/true);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ((*mapped)->data()[0], 42);
  (*mapped)->data()[1] = 9;
  EXPECT_EQ((*region)->data()[1], 9) << "one memory for both sides";

  auto again = FetchSharedMemory((*offer)->socket_name(), ticket, 1);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kPermissionDenied);
  std::string forged = ticket;
  forged[0] = forged[0] == 'a' ? 'b' : 'a';
  const std::string other = (*offer)->IssueTicket(1, {dup((*region)->fd())});
  auto wrong = FetchSharedMemory((*offer)->socket_name(), forged, 1);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied);
  auto nowhere = FetchSharedMemory("dp-ps-no-such-socket", other, 1);
  EXPECT_EQ(nowhere.status().code(), absl::StatusCode::kUnavailable);
}

// `n` copies of `value`, to publish.
std::vector<float> Filled(int64_t n, float value) {
  return std::vector<float>(n, value);
}

// Whether the `n` float32 values at `values` all equal `value`.
bool AllAre(const char* values, int64_t n, float value) {
  const float* f = reinterpret_cast<const float*>(values);
  return std::all_of(f, f + n, [value](float x) { return x == value; });
}

// Version v lies in buffer v % 2: two versions in a row are both there, each
// in its own half of the region, on a cache line of its own.
TEST(SharedMemoryTest, TwoVersionsLieInTwoBuffersByParity) {
  const int64_t n = 1001;  // not a multiple of a cache line's floats
  auto region =
      SharedRegion::Create("weights", WeightsRegionBytes(n, Encoding::kF32));
  ASSERT_TRUE(region.ok());
  PublishWeights(region->get(), 6, Encoding::kF32, Filled(n, 6.0f));
  PublishWeights(region->get(), 7, Encoding::kF32, Filled(n, 7.0f));
  auto six = FindWeights(**region, 6, n);
  auto seven = FindWeights(**region, 7, n);
  ASSERT_TRUE(six.ok()) << six.status();
  ASSERT_TRUE(seven.ok()) << seven.status();
  EXPECT_EQ(six->step, 6);
  EXPECT_EQ(seven->step, 7);
  EXPECT_EQ(six->encoding, Encoding::kF32);
  EXPECT_EQ(six->num_values, n);
  EXPECT_TRUE(AllAre(six->values, n, 6.0f));
  EXPECT_TRUE(AllAre(seven->values, n, 7.0f));
  const char* base = (*region)->data();
  const size_t half = (*region)->size() / 2;
  EXPECT_LT(six->values, base + half);
  EXPECT_GE(seven->values, base + half);
  EXPECT_LE(seven->values + n * sizeof(float), base + (*region)->size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(six->values) % 64, 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(seven->values) % 64, 0);
  // Version 8 replaces 6, not 7: moved under the read, which a worker
  // mends by reading again (not by joining again).
  PublishWeights(region->get(), 8, Encoding::kF32, Filled(n, 8.0f));
  const absl::Status replaced = FindWeights(**region, 6, n).status();
  EXPECT_EQ(replaced.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(IsMovedUnderRead(replaced)) << replaced;
  EXPECT_FALSE(IsMovedUnderRead(absl::AbortedError("this shard is behind")));
  auto again = FindWeights(**region, 7, n);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(AllAre(again->values, n, 7.0f));
  std::vector<float> out(n);
  ASSERT_TRUE(ReadWeights(**region, 8, absl::MakeSpan(out)).ok());
  EXPECT_TRUE(AllAre(reinterpret_cast<const char*>(out.data()), n, 8.0f));
}

// A worker computes from version v in place while dp-ps publishes v + 1:
// nothing it reads moves, and its buffer still holds v afterwards.
TEST(SharedMemoryTest, AReaderOfAVersionIsNotDisturbedByThePublishOfTheNext) {
  const int64_t n = 5000;
  auto region =
      SharedRegion::Create("weights", WeightsRegionBytes(n, Encoding::kF32));
  ASSERT_TRUE(region.ok());
  PublishWeights(region->get(), 0, Encoding::kF32, Filled(n, 0.5f));
  PublishWeights(region->get(), 1, Encoding::kF32, Filled(n, 1.5f));
  auto found = FindWeights(**region, 1, n);
  ASSERT_TRUE(found.ok()) << found.status();
  PublishWeights(region->get(), 2, Encoding::kF32, Filled(n, 2.5f));
  EXPECT_TRUE(AllAre(found->values, n, 1.5f)) << "v + 1 overwrote v";
  EXPECT_TRUE(StillHolds(**region, *found));
}

// Version v + 2 lands in the buffer a worker computes v from (a process of
// its rank pushed for it, or the shard rolled back): the worker sees that
// its buffer no longer holds what it found, and its gradient is of no
// version. The same for v written again (a rollback to v with other values).
TEST(SharedMemoryTest, AVersionRewrittenUnderItsReaderIsDetected) {
  const int64_t n = 5000;
  auto region =
      SharedRegion::Create("weights", WeightsRegionBytes(n, Encoding::kF32));
  ASSERT_TRUE(region.ok());
  PublishWeights(region->get(), 4, Encoding::kF32, Filled(n, 4.0f));
  auto found = FindWeights(**region, 4, n);
  ASSERT_TRUE(found.ok()) << found.status();
  PublishWeights(region->get(), 5, Encoding::kF32, Filled(n, 5.0f));
  ASSERT_TRUE(StillHolds(**region, *found));
  PublishWeights(region->get(), 6, Encoding::kF32, Filled(n, 6.0f));
  EXPECT_FALSE(StillHolds(**region, *found)) << "a stale read went unseen";
  EXPECT_EQ(FindWeights(**region, 4, n).status().code(),
            absl::StatusCode::kAborted);

  auto six = FindWeights(**region, 6, n);
  ASSERT_TRUE(six.ok()) << six.status();
  PublishWeights(region->get(), 6, Encoding::kF32, Filled(n, -6.0f));
  EXPECT_FALSE(StillHolds(**region, *six)) << "a rewritten version went unseen";
}

// A buffer that does not hold what the worker was told is DATA_LOSS: one
// never written, or one of another number of values.
TEST(SharedMemoryTest, AWeightsBufferThatHoldsSomethingElseIsDataLoss) {
  const int64_t n = 100;
  auto region =
      SharedRegion::Create("weights", WeightsRegionBytes(n, Encoding::kF32));
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(FindWeights(**region, 0, n).status().code(),
            absl::StatusCode::kDataLoss);
  PublishWeights(region->get(), 1, Encoding::kF32, Filled(n, 1.0f));
  std::vector<float> more(n + 1);
  EXPECT_EQ(ReadWeights(**region, 1, absl::MakeSpan(more)).code(),
            absl::StatusCode::kDataLoss);
  // bf16 values of a region sized for them read back decoded.
  auto bf16 =
      SharedRegion::Create("weights", WeightsRegionBytes(n, Encoding::kBf16));
  ASSERT_TRUE(bf16.ok());
  PublishWeights(bf16->get(), 3, Encoding::kBf16, Filled(n, 1.0f));
  // Encoded as written: the buffer holds 1.0 in bf16.
  auto found = FindWeights(**bf16, 3, n);
  ASSERT_TRUE(found.ok()) << found.status();
  uint16_t first;
  std::memcpy(&first, found->values, sizeof(first));
  EXPECT_EQ(first, 0x3f80);
  std::vector<float> out(n);
  ASSERT_TRUE(ReadWeights(**bf16, 3, absl::MakeSpan(out)).ok());
  EXPECT_TRUE(AllAre(reinterpret_cast<const char*>(out.data()), n, 1.0f));
}

TEST(SharedMemoryTest, ReadersSeeWholeVersionsWhileTheWriterPublishes) {
  const int64_t n = 5000;
  auto region =
      SharedRegion::Create("weights", WeightsRegionBytes(n, Encoding::kF32));
  ASSERT_TRUE(region.ok());
  // Version v holds the value v everywhere: a torn read shows two values.
  std::vector<float> values(n);
  auto publish = [&](int64_t v) {
    std::fill(values.begin(), values.end(), static_cast<float>(v));
    PublishWeights(region->get(), v, Encoding::kF32, values);
  };
  publish(0);
  // The writer publishes until the reader has made kOverlapping reads of a
  // version during which its buffer was written again (v + 2 published):
  // reads that raced the writer on their own buffer.
  constexpr int kOverlapping = 200;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  std::atomic<int64_t> published{0};
  std::atomic<int> overlapping{0};
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int64_t v = 1;
         overlapping.load() < kOverlapping && absl::Now() < give_up; ++v) {
      publish(v);
      published.store(v);
    }
    done.store(true);
  });
  int reads = 0, whole = 0, torn = 0;
  std::vector<float> out(n);
  while (!done.load()) {
    // The version before the newest: its buffer is the one the writer
    // writes next, so a read races a publish whenever one more comes while
    // it reads (under a sanitizer, reads of the newest raced too rarely).
    const int64_t version = std::max<int64_t>(0, published.load() - 1);
    const absl::Status read =
        ReadWeights(**region, version, absl::MakeSpan(out));
    if (published.load() >= version + 2) overlapping.fetch_add(1);
    ++reads;
    // ABORTED: the buffer moved on to version + 2 before the read ended.
    if (read.code() == absl::StatusCode::kAborted) continue;
    ASSERT_TRUE(read.ok()) << read;
    ++whole;
    for (float x : out) {
      if (x != static_cast<float>(version)) {
        ++torn;
        break;
      }
    }
  }
  writer.join();
  EXPECT_GE(overlapping.load(), kOverlapping)
      << "too few reads raced the writer to tell (" << reads << " reads)";
  EXPECT_GT(whole, 0) << "no read succeeded";
  EXPECT_EQ(torn, 0) << "of " << whole << " reads";
}

// A read that meets a publish of its version waits for it instead of giving
// up: the writer here holds the buffer for the copy of 64 MB.
TEST(SharedMemoryTest, AReadThatMeetsAPublishWaitsForIt) {
  const int64_t n = 16 << 20;
  auto region =
      SharedRegion::Create("weights", WeightsRegionBytes(n, Encoding::kF32));
  ASSERT_TRUE(region.ok());
  const std::vector<float> values(n, 1.0f);
  PublishWeights(region->get(), 1, Encoding::kF32, values);
  std::vector<float> out(n);
  int met = 0;
  for (int round = 0; round < 5; ++round) {
    // Into buffer 1, over the version before.
    const int64_t version = 3 + 2 * round;
    std::atomic<bool> writing{false};
    std::thread writer([&] {
      writing.store(true);
      PublishWeights(region->get(), version, Encoding::kF32, values);
    });
    while (!writing.load()) {
    }
    // ABORTED: read before the publish began (the buffer held version - 2).
    const absl::Status read =
        ReadWeights(**region, version, absl::MakeSpan(out));
    writer.join();
    ASSERT_TRUE(read.ok() || read.code() == absl::StatusCode::kAborted)
        << "round " << round << ": " << read;
    met += read.ok();
  }
  EXPECT_GT(met, 0) << "no read met a publish: the test did not test";
}

// A rank holds one ticket at a time, and an unredeemed ticket is withdrawn
// after its lifetime: descriptors of workers that never take the memory
// are closed, not kept.
TEST(SharedMemoryTest, UnredeemedTicketsAreReplacedAndExpire) {
  // A lifetime far above the time the loop below takes on a loaded machine,
  // so that no ticket expires before it is counted.
  auto offer = SharedMemoryOffer::Start(absl::Seconds(3));
  ASSERT_TRUE(offer.ok()) << offer.status();
  auto region = SharedRegion::Create("test", 4096);
  ASSERT_TRUE(region.ok());
  const int before = OpenDescriptors();
  std::string last;
  for (int i = 0; i < 300; ++i) {
    last = (*offer)->IssueTicket(/*owner=*/3, {dup((*region)->fd())});
  }
  (void)(*offer)->IssueTicket(/*owner=*/4, {dup((*region)->fd())});
  EXPECT_EQ((*offer)->outstanding_tickets(), 2);
  EXPECT_EQ(OpenDescriptors(), before + 2) << "replaced tickets kept theirs";
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while ((*offer)->outstanding_tickets() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ((*offer)->outstanding_tickets(), 0) << "no ticket expired";
  EXPECT_EQ(OpenDescriptors(), before);
  auto late = FetchSharedMemory((*offer)->socket_name(), last, 1);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kPermissionDenied);
}

// A fake dp-ps that sends `fds` with the verdict, in control messages of
// `per_message` descriptors each.
std::string ServeOnce(const std::vector<int>& fds, size_t per_message,
                      std::thread* server) {
  const std::string name =
      absl::StrCat("dp-ps-test-", getpid(), "-", fds.size(), "-", per_message);
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const socklen_t len = offsetof(sockaddr_un, sun_path) + 1 + name.size();
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(listener, 1) != 0) {
    return "";
  }
  *server = std::thread([listener, fds, per_message] {
    const int conn = accept(listener, nullptr, nullptr);
    char ticket[32];
    (void)!read(conn, ticket, sizeof(ticket));
    char verdict = 1;
    iovec iov{&verdict, 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()) * 4);
    msg.msg_control = control.data();
    size_t used = 0;
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    for (size_t at = 0; at < fds.size(); at += per_message) {
      const size_t k = std::min(per_message, fds.size() - at);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * k);
      std::memcpy(CMSG_DATA(c), fds.data() + at, sizeof(int) * k);
      used += CMSG_SPACE(sizeof(int) * k);
      c = reinterpret_cast<cmsghdr*>(reinterpret_cast<char*>(c) +
                                     CMSG_SPACE(sizeof(int) * k));
    }
    msg.msg_controllen = used;
    (void)sendmsg(conn, &msg, MSG_NOSIGNAL);
    close(conn);
    close(listener);
  });
  return name;
}

// Descriptors a worker did not ask for - in two control messages, or more
// than fit - are refused and closed, never kept open or half-used.
TEST(SharedMemoryTest, AHandoverOfOtherDescriptorsIsRefusedAndClosed) {
  auto region = SharedRegion::Create("test", 4096);
  ASSERT_TRUE(region.ok());
  struct Case {
    size_t fds, per_message;
  };
  for (const Case& c : {Case{2, 2}, Case{4, 2}, Case{3, 1}, Case{6, 6}}) {
    std::vector<int> fds;
    for (size_t i = 0; i < c.fds; ++i) fds.push_back((*region)->fd());
    const int before = OpenDescriptors();
    std::thread server;
    const std::string name = ServeOnce(fds, c.per_message, &server);
    ASSERT_FALSE(name.empty());
    auto got = FetchSharedMemory(name, std::string(32, 'a'), 2);
    server.join();
    if (c.fds == 2) {
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->size(), 2u);
      for (int fd : *got) close(fd);
    } else {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss)
          << c.fds << " descriptors in messages of " << c.per_message << ": "
          << got.status();
    }
    EXPECT_EQ(OpenDescriptors(), before)
        << c.fds << " descriptors in messages of " << c.per_message;
  }
}

// A region whose size cannot be read is named as such, not with a size
// nobody measured.
TEST(SharedMemoryTest, MappingABadDescriptorSaysWhy) {
  auto mapped = SharedRegion::Map(/*fd=*/-1, 4096, /*writable=*/false);
  ASSERT_FALSE(mapped.ok());
  EXPECT_NE(mapped.status().message().find("fstat"), std::string::npos)
      << mapped.status();
}

}  // namespace
}  // namespace dp
