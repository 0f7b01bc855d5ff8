// A local worker that misuses the shared memory dp-ps gave it, against a
// real dp-ps process: it may shrink or grow its slot, reopen the weights for
// writing, rewrite its gradient while dp-ps reads it, push through a slot
// that a newer process of its rank replaced, or register without ever taking
// the memory. dp-ps refuses what must be refused, keeps training, and no NaN
// reaches the weights.
#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_layout.h"
#include "common/shared_memory.h"
#include "common/step_channel.h"
#include "gtest/gtest.h"
#include "proto/dp.grpc.pb.h"
#include "tests/job_runner.h"
#include "tests/raw_client.h"

namespace dp {
namespace {

// A worker speaking dp.v1 by hand, with the memory dp-ps handed it.
class Intruder {
 public:
  Intruder(int port, int rank) : rank_(rank), stub_(ConnectRaw(port)) {}
  ~Intruder() {
    for (int fd : fds_) close(fd);
    if (slot_ != nullptr) munmap(slot_, length_ * sizeof(float));
  }

  // Register asking for shared memory; the answer's ticket and slot id.
  grpc::Status Register(dp::v1::RegisterResponse* response) {
    dp::v1::RegisterRequest request =
        RawRegisterRequest(rank_, ModelLayout::SimpleNet().Fingerprint(),
                           DataFingerprint{1000, 7});
    request.set_shared_memory(true);
    return RawRegister(*stub_, request, response);
  }

  // Registers and takes the memory: fds_[0] the weights (read-only),
  // fds_[1] the slot, mapped at slot().
  void Join() {
    dp::v1::RegisterResponse response;
    ASSERT_TRUE(Register(&response).ok());
    ASSERT_FALSE(response.shm_socket().empty()) << "no shared memory offered";
    slot_id_ = response.shm_slot();
    offset_ = response.shard().offset();
    length_ = response.shard().length();
    auto fds =
        FetchSharedMemory(response.shm_socket(), response.shm_ticket(), 3);
    ASSERT_TRUE(fds.ok()) << fds.status();
    fds_ = *fds;
    void* p = mmap(nullptr, length_ * sizeof(float), PROT_READ | PROT_WRITE,
                   MAP_SHARED, fds_[1], 0);
    ASSERT_NE(p, MAP_FAILED);
    slot_ = static_cast<float*>(p);
  }

  float* slot() { return slot_; }
  // The step channel's page dp-ps handed over (fds_[2]), as a worker's.
  ChannelClient& channel() {
    if (channel_ == nullptr) {
      auto page = SharedRegion::Map(dup(fds_[2]), kStepChannelBytes, true);
      EXPECT_TRUE(page.ok()) << page.status();
      page_ = *std::move(page);
      channel_ = std::make_unique<ChannelClient>(page_.get());
    }
    return *channel_;
  }
  char* page() { return channel(), page_->data(); }
  // Writes `value` into every value of the slot.
  void Fill(float value) { std::fill(slot_, slot_ + length_, value); }
  int weights_fd() const { return fds_[0]; }
  int slot_fd() const { return fds_[1]; }
  uint64_t slot_id() const { return slot_id_; }

  // PushPull of the gradient in the slot, weights over gRPC (or published
  // in shared memory with weights_in_shm).
  grpc::Status PushPull(int64_t step, dp::v1::PullResponse* response,
                        bool weights_in_shm = false,
                        std::optional<uint64_t> slot_id = std::nullopt) {
    dp::v1::PushRequest request;
    request.set_rank(rank_);
    request.set_step(step);
    request.set_offset(offset_);
    request.set_loss(1.0f);
    request.set_num_samples(8);
    request.set_gradient_in_shm(true);
    request.set_shm_slot(slot_id.value_or(slot_id_));
    request.set_weights_in_shm(weights_in_shm);
    return RawPushPull(*stub_, request, response, RawCall{absl::Seconds(30)});
  }

  absl::StatusOr<dp::v1::PullResponse> PullOverGrpc() {
    dp::v1::PullRequest request;
    request.set_rank(rank_);
    request.set_offset(offset_);
    dp::v1::PullResponse response;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->Pull(&ctx, request, &response);
    if (!s.ok()) return absl::InternalError(s.error_message());
    return response;
  }

  int64_t Step() {
    dp::v1::GetStatusRequest request;
    dp::v1::GetStatusResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return stub_->GetStatus(&ctx, request, &response).ok() ? response.step()
                                                           : -1;
  }

 private:
  const int rank_;
  std::unique_ptr<dp::v1::ParameterServer::Stub> stub_;
  std::vector<int> fds_;
  float* slot_ = nullptr;
  uint64_t slot_id_ = 0;
  int64_t offset_ = 0;  // the dp-ps's range of the vector (a shard's)
  int64_t length_ = 0;
  std::unique_ptr<SharedRegion> page_;
  std::unique_ptr<ChannelClient> channel_;
};

// Each attack against one dp-ps, and against the last of two shards: every
// shard has its own shared memory and checks.
class SharedMemoryAttackTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    const std::vector<std::string> args = {"--workers=1", "--batch_size=8",
                                           "--dataset=synthetic",
                                           "--max_steps=100000"};
    std::vector<int> ports;
    ps_ = StartShards(GetParam(), args, &ports);
    port_ = ports.back();
    ASSERT_GT(port_, 0);
  }
  // The dp-ps (shard) under attack.
  Subprocess& ps() { return *ps_.back(); }

  std::vector<std::unique_ptr<Subprocess>> ps_;
  int port_ = 0;
};

INSTANTIATE_TEST_SUITE_P(OneDpPsAndAShard, SharedMemoryAttackTest,
                         ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 1 ? std::string("OneDpPs")
                                                  : std::string("Shard1Of2");
                         });

int OpenDescriptors(pid_t pid) {
  int n = 0;
  if (DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str())) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

bool AllFinite(const dp::v1::PullResponse& r) {
  std::vector<float> w(r.params().size() / sizeof(float));
  std::memcpy(w.data(), r.params().data(), r.params().size());
  for (float x : w) {
    if (!std::isfinite(x)) return false;
  }
  return !w.empty();
}

// A slot shrunk under dp-ps (or the weights, reopened for writing) would
// make dp-ps's next read or publish a SIGBUS: the sizes are sealed.
TEST_P(SharedMemoryAttackTest, ShrinkingTheMemoryCannotCrashDpPs) {
  Intruder w(port_, 0);
  w.Join();
  w.Fill(0.001f);
  EXPECT_NE(ftruncate(w.slot_fd(), 0), 0) << "the slot could be shrunk";
  EXPECT_NE(ftruncate(w.slot_fd(), 64 << 20), 0) << "the slot could grow";
  dp::v1::PullResponse response;
  grpc::Status pushed = w.PushPull(0, &response, /*weights_in_shm=*/true);
  EXPECT_TRUE(pushed.ok() ||
              pushed.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
      << pushed.error_message();

  const int rw = open(absl::StrCat("/proc/self/fd/", w.weights_fd()).c_str(),
                      O_RDWR | O_CLOEXEC);
  if (rw >= 0) {  // root may reopen it; the size is still sealed
    EXPECT_NE(ftruncate(rw, 0), 0) << "the weights could be shrunk";
    close(rw);
  }
  const int64_t step = w.Step();
  ASSERT_GE(step, 0) << "dp-ps stopped answering: " << ps().output();
  w.Fill(0.001f);
  ASSERT_TRUE(w.PushPull(step, &response, /*weights_in_shm=*/true).ok())
      << ps().output();
  EXPECT_EQ(w.Step(), step + 1) << ps().output();
  EXPECT_FALSE(ps().Wait(absl::ZeroDuration()).has_value()) << ps().output();
}

// A worker that rewrites a value between NaN and 0 while dp-ps reads its
// slot: every push is either refused or accepted with what was checked.
TEST_P(SharedMemoryAttackTest,
       RewritingTheSlotDuringAPushCannotPoisonTheModel) {
  Intruder w(port_, 0);
  w.Join();
  w.Fill(0.001f);
  std::atomic<bool> stop{false};
  std::thread flipper([&] {
    volatile float* x = w.slot() + 4321;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    while (!stop.load(std::memory_order_relaxed)) {
      *x = nan;
      *x = 0.0f;
    }
  });
  int accepted = 0, refused = 0;
  for (int i = 0; i < 300; ++i) {
    dp::v1::PullResponse response;
    const grpc::Status s = w.PushPull(w.Step(), &response);
    if (s.ok()) {
      ++accepted;
    } else {
      ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << s.error_message();
      ++refused;
    }
  }
  stop.store(true);
  flipper.join();
  w.Fill(0.001f);
  dp::v1::PullResponse response;
  ASSERT_TRUE(w.PushPull(w.Step(), &response).ok());
  auto weights = w.PullOverGrpc();
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_TRUE(AllFinite(*weights))
      << "a NaN reached the weights (" << accepted << " pushes accepted, "
      << refused << " refused)";
}

// The weights are dp-ps's to write: a worker that reopens its read-only
// descriptor through /proc cannot map or write it.
TEST_P(SharedMemoryAttackTest, AWorkerCannotWriteTheWeightsOthersRead) {
  Intruder w(port_, 0);
  w.Join();
  w.Fill(0.001f);
  dp::v1::PullResponse response;
  ASSERT_TRUE(w.PushPull(0, &response, /*weights_in_shm=*/true).ok());
  const int rw = open(absl::StrCat("/proc/self/fd/", w.weights_fd()).c_str(),
                      O_RDWR | O_CLOEXEC);
  if (rw < 0) {
    SUCCEED() << "not even reopened (a non-root worker)";
    return;
  }
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
  EXPECT_EQ(p, MAP_FAILED) << "the weights could be mapped for writing";
  if (p != MAP_FAILED) munmap(p, 4096);
  const char byte = 1;
  EXPECT_NE(pwrite(rw, &byte, 1, 4096), 1) << "the weights could be written";
  close(rw);
}

// Two processes of one rank (a restarted pod whose predecessor lingers): a
// push through the slot of the older registration is refused, not read from
// the newer process's slot.
TEST_P(SharedMemoryAttackTest, APushThroughAReplacedSlotIsRefused) {
  Intruder old_process(port_, 0);
  old_process.Join();
  Intruder new_process(port_, 0);
  new_process.Join();
  ASSERT_NE(old_process.slot_id(), new_process.slot_id());
  old_process.Fill(0.5f);
  new_process.Fill(0.001f);
  dp::v1::PullResponse response;
  const grpc::Status stale = old_process.PushPull(0, &response);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << stale.error_message();
  EXPECT_EQ(new_process.Step(), 0) << "the stale push counted" << ps().output();
  const grpc::Status forged =
      new_process.PushPull(0, &response, false, new_process.slot_id() ^ 1);
  EXPECT_EQ(forged.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << forged.error_message();
  ASSERT_TRUE(new_process.PushPull(0, &response).ok());
  EXPECT_EQ(new_process.Step(), 1);
}

ChannelRequest ChannelPush(int64_t step) {
  ChannelRequest r;
  r.step = step;
  r.loss = 1.0f;
  r.num_samples = 8;
  return r;
}

// Through the step channel's page a worker can post any words: each
// nonsense request is answered with the refusal a PushPull call would get,
// nothing is counted, and the page goes on serving.
TEST_P(SharedMemoryAttackTest, NonsenseThroughTheStepChannelIsRefused) {
  Intruder w(port_, 0);
  w.Join();
  w.Fill(0.001f);
  ChannelRequest future = ChannelPush(1 << 30);
  ChannelRequest not_a_node = ChannelPush(0);
  not_a_node.block_first = 3;
  not_a_node.block_count = 7;
  ChannelRequest nan_loss = ChannelPush(0);
  nan_loss.loss = std::numeric_limits<float>::quiet_NaN();
  ChannelRequest encoding = ChannelPush(0);
  encoding.encoding = 77;
  ChannelRequest unknown_kind = ChannelPush(0);
  unknown_kind.kind = static_cast<ChannelKind>(9);
  ChannelRequest future_push = future;
  future_push.kind = ChannelKind::kPush;
  ChannelRequest future_pull;
  future_pull.kind = ChannelKind::kPull;
  future_pull.step = 1 << 30;
  ChannelRequest negative_pull = future_pull;
  negative_pull.step = -1;
  for (const ChannelRequest& bad :
       {future, not_a_node, nan_loss, encoding, unknown_kind, future_push,
        future_pull, negative_pull}) {
    absl::StatusOr<ChannelResponse> a =
        w.channel().Call(bad, absl::Seconds(60));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_NE(a->code, absl::StatusCode::kOk) << "step " << bad.step;
    EXPECT_FALSE(a->message.empty());
    EXPECT_EQ(w.Step(), 0) << a->message;
  }
  absl::StatusOr<ChannelResponse> a =
      w.channel().Call(unknown_kind, absl::Seconds(60));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->code, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a->message.find("request kind 9"), std::string::npos) << a->message;
  // A request whose words change while dp-ps reads them: one of them.
  std::atomic<bool> stop{false};
  std::thread scribbler([&] {
    auto* step = reinterpret_cast<std::atomic<int64_t>*>(w.page() + 8);
    while (!stop.load(std::memory_order_relaxed)) {
      step->store(0, std::memory_order_relaxed);
      step->store(-5, std::memory_order_relaxed);
    }
  });
  a = w.channel().Call(ChannelPush(0), absl::Seconds(60));
  stop.store(true);
  scribbler.join();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->code == absl::StatusCode::kOk ||
              a->code == absl::StatusCode::kInvalidArgument)
      << a->message;
  const int64_t step = w.Step();
  a = w.channel().Call(ChannelPush(step), absl::Seconds(60));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->code, absl::StatusCode::kOk) << a->message;
  EXPECT_EQ(a->step, step + 1);
  EXPECT_FALSE(ps().Wait(absl::ZeroDuration()).has_value()) << ps().output();
}

// The page of a registration that a newer process of the rank replaced is
// closed: the older process's wait ends with the reason, nothing counts.
TEST_P(SharedMemoryAttackTest, AReplacedRegistrationsStepChannelIsClosed) {
  Intruder old_process(port_, 0);
  old_process.Join();
  old_process.channel();
  Intruder new_process(port_, 0);
  new_process.Join();
  old_process.Fill(0.5f);
  new_process.Fill(0.001f);
  absl::StatusOr<ChannelResponse> stale =
      old_process.channel().Call(ChannelPush(0), absl::Seconds(60));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition)
      << stale.status();
  EXPECT_EQ(new_process.Step(), 0) << "the stale push counted";
  absl::StatusOr<ChannelResponse> a =
      new_process.channel().Call(ChannelPush(0), absl::Seconds(60));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->code, absl::StatusCode::kOk) << a->message;
  EXPECT_EQ(new_process.Step(), 1);
}

// A worker from another host asks for shared memory at every registration
// and never takes it: dp-ps keeps one ticket per rank, not one per
// registration.
TEST_P(SharedMemoryAttackTest, TicketsNeverRedeemedDoNotLeakDescriptors) {
  Intruder w(port_, 0);
  dp::v1::RegisterResponse response;
  ASSERT_TRUE(w.Register(&response).ok());
  const int before = OpenDescriptors(ps().pid());
  ASSERT_GT(before, 0);
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(w.Register(&response).ok());
    ASSERT_FALSE(response.shm_ticket().empty());
  }
  EXPECT_LE(OpenDescriptors(ps().pid()), before + 2)
      << "300 unredeemed registrations took dp-ps from " << before;
}

}  // namespace
}  // namespace dp
