// dp-ps as the parameter server of a model that is not an MLP: real dp-ps
// processes started from a safetensors file of CNN-shaped tensors, driven
// over real gRPC (and shared memory) by a worker that speaks dp.v1 by hand
// and pushes gradients known in advance, so that every weight can be
// checked against server/adam.h's Adam applied to the same averages.
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "common/model_layout.h"
#include "common/safetensors.h"
#include "common/shared_memory.h"
#include "gtest/gtest.h"
#include "proto/dp.grpc.pb.h"
#include "server/adam.h"
#include "server/checkpoint.h"
#include "tests/job_runner.h"
#include "tests/raw_client.h"

namespace dp {
namespace {

constexpr int kMicroBatches = 2;  // a step: 2 micro-batches, both rank 0's
constexpr double kLr = 0.01;
const DataFingerprint kData{6400, 7};

// Not in the names' order (conv1.bias sorts before conv1.weight), so that
// a model laid out by name would show.
ModelLayout Cnn() {
  return *ModelLayout::FromTensors({{"conv1.weight", {4, 1, 3, 3}},
                                    {"conv1.bias", {4}},
                                    {"conv2.weight", {8, 4, 3, 3}},
                                    {"conv2.bias", {8}},
                                    {"fc.weight", {10, 8 * 5 * 5}},
                                    {"fc.bias", {10}}});
}

std::vector<float> InitialWeights(int64_t n) {
  std::vector<float> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = 0.05f * std::sin(0.37 * i);
  return p;
}

// Micro-batch `micro`'s gradient of step `step`: the same in every run.
std::vector<float> Gradient(int64_t step, int micro, int64_t n) {
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = 0.1f * static_cast<float>(
                      std::cos(0.013 * i + 1.7 * step + 0.61 * micro));
  }
  return g;
}

// The weights after `steps` steps: Adam on the mean of each step's
// micro-batch gradients, as one dp-ps must compute it.
std::vector<float> ReferenceWeights(int64_t steps) {
  const int64_t n = Cnn().num_params();
  std::vector<float> p = InitialWeights(n), m(n, 0.0f), v(n, 0.0f);
  AdamOptions options;
  options.lr = kLr;
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<std::vector<float>> g;
    for (int k = 0; k < kMicroBatches; ++k) g.push_back(Gradient(s, k, n));
    const float* grads[kMicroBatches] = {g[0].data(), g[1].data()};
    AverageAndAdamStep(options, s + 1, 1000, grads, n, p.data(), m.data(),
                       v.data());
  }
  return p;
}

std::vector<std::string> JobArgs(const std::string& init) {
  return {"--init_model=" + init,
          "--dataset=synthetic",
          "--workers=1",
          "--batch_size=8",
          absl::StrCat("--global_batch=", 8 * kMicroBatches),
          "--backup_blocks=0",
          "--max_steps=1000",
          "--worker_timeout_s=600",
          absl::StrCat("--lr=", kLr)};
}

// The init file of Cnn() in `dir`.
std::string WriteInit(const TempDir& dir) {
  const ModelLayout layout = Cnn();
  const std::string path = dir.File("init.safetensors");
  EXPECT_TRUE(
      SaveSafetensors(path, layout, InitialWeights(layout.num_params())).ok());
  return path;
}

// Rank 0 of a job of any model, by hand: it learns the model from
// GetStatus (JobConfig.tensors, model_fingerprint), registers at every
// shard and, each step, pushes its block's summed gradient (over gRPC or
// through the shard's shared-memory slot) and reads back the new weights.
class HandWorker {
 public:
  HandWorker(std::vector<int> ports, bool shared_memory)
      : ports_(std::move(ports)), shared_memory_(shared_memory) {}
  ~HandWorker() {
    for (Shard& s : shards_) {
      if (s.slot != nullptr) munmap(s.slot, s.length * sizeof(float));
      for (int fd : s.fds) close(fd);
    }
  }

  // Registers at every shard; *weights gets the weights of the job's step.
  void Join(std::vector<float>* weights) {
    const std::optional<dp::v1::GetStatusResponse> status = StatusAt(ports_[0]);
    ASSERT_TRUE(status.has_value());
    const dp::v1::JobConfig& config = status->config();
    fingerprint_ = config.model_fingerprint();
    step_ = status->step();
    int64_t n = 0;
    for (const dp::v1::TensorSpec& t : config.tensors()) {
      int64_t size = 1;
      for (int64_t d : t.shape()) size *= d;
      n += size;
    }
    weights->assign(n, 0.0f);
    for (int port : ports_) {
      Shard s;
      s.stub = ConnectRaw(port);
      dp::v1::RegisterRequest request =
          RawRegisterRequest(0, fingerprint_, kData);
      request.set_shared_memory(shared_memory_);
      dp::v1::RegisterResponse response;
      const grpc::Status r = RawRegister(*s.stub, request, &response);
      ASSERT_TRUE(r.ok()) << r.error_message();
      // Each shard holds a range of its own.
      if (ports_.size() > 1) {
        ASSERT_EQ(response.shard().count(), static_cast<int>(ports_.size()));
      }
      s.offset = response.shard().offset();
      s.length = response.shard().length();
      if (s.length == 0) s.length = n;
      if (shared_memory_) MapSlot(response, &s);
      shards_.push_back(std::move(s));
    }
    for (Shard& s : shards_) {
      dp::v1::PullRequest pull;
      pull.set_rank(0);
      pull.set_offset(s.offset);
      pull.set_length(s.length);
      dp::v1::PullResponse response;
      grpc::ClientContext ctx;
      ASSERT_TRUE(s.stub->Pull(&ctx, pull, &response).ok());
      ASSERT_NO_FATAL_FAILURE(Take(response, /*planned=*/false, weights));
    }
  }

  // One step: the sum of both micro-batches' gradients to every shard.
  void Step(std::vector<float>* weights) {
    const int64_t n = static_cast<int64_t>(weights->size());
    std::vector<float> sum = Gradient(step_, 0, n);
    const std::vector<float> g1 = Gradient(step_, 1, n);
    for (int64_t i = 0; i < n; ++i) sum[i] += g1[i];
    for (Shard& s : shards_) {
      dp::v1::PushRequest push = RawPushRequest(
          0, step_, absl::MakeConstSpan(sum).subspan(s.offset, s.length));
      push.set_offset(s.offset);
      push.set_num_samples(8 * kMicroBatches);
      push.mutable_block()->set_first(0);
      push.mutable_block()->set_count(kMicroBatches);
      if (shared_memory_) {
        std::memcpy(s.slot, sum.data() + s.offset, s.length * sizeof(float));
        push.clear_gradient();
        push.set_gradient_in_shm(true);
        push.set_shm_slot(s.slot_id);
      }
      dp::v1::PullResponse response;
      const grpc::Status r = RawPushPull(*s.stub, push, &response,
                                         RawCall{absl::Seconds(60)});
      ASSERT_TRUE(r.ok()) << r.error_message();
      ASSERT_EQ(response.step(), step_ + 1);
      ASSERT_NO_FATAL_FAILURE(Take(response, /*planned=*/true, weights));
    }
    ++step_;
  }

  uint64_t fingerprint() const { return fingerprint_; }

 private:
  struct Shard {
    std::unique_ptr<RawStub> stub;
    int64_t offset = 0, length = 0;
    std::vector<int> fds;
    float* slot = nullptr;
    uint64_t slot_id = 0;
  };

  void MapSlot(const dp::v1::RegisterResponse& response, Shard* s) {
    ASSERT_FALSE(response.shm_socket().empty()) << "no shared memory offered";
    // The weights, the gradient slot and the step channel's page (unused:
    // this worker pushes with calls).
    absl::StatusOr<std::vector<int>> fds =
        FetchSharedMemory(response.shm_socket(), response.shm_ticket(), 3);
    ASSERT_TRUE(fds.ok()) << fds.status();
    s->fds = *fds;
    void* p = mmap(nullptr, s->length * sizeof(float), PROT_READ | PROT_WRITE,
                   MAP_SHARED, s->fds[1], 0);
    ASSERT_NE(p, MAP_FAILED);
    s->slot = static_cast<float*>(p);
    s->slot_id = response.shm_slot();
  }

  // The weights of a pull into their place. Once a step is planned, its
  // block is the whole step's, rank 0's alone.
  void Take(const dp::v1::PullResponse& r, bool planned,
            std::vector<float>* weights) {
    ASSERT_FALSE(r.params_in_shm());
    if (planned || r.block().count() != 0) {
      ASSERT_EQ(r.block().first(), 0);
      ASSERT_EQ(r.block().count(), kMicroBatches);
    }
    const size_t floats = r.params().size() / sizeof(float);
    ASSERT_LE(r.offset() + floats, weights->size());
    std::memcpy(weights->data() + r.offset(), r.params().data(),
                r.params().size());
  }

  std::vector<int> ports_;
  bool shared_memory_;
  std::vector<Shard> shards_;
  uint64_t fingerprint_ = 0;
  int64_t step_ = 0;
};

// The weights after `steps` steps of the job on `shards` dp-ps shards.
std::vector<float> RunSteps(const std::vector<std::string>& args, int shards,
                            bool shared_memory, int steps) {
  std::vector<int> ports;
  std::vector<std::unique_ptr<Subprocess>> ps =
      StartShards(shards, args, &ports);
  HandWorker worker(ports, shared_memory);
  std::vector<float> weights;
  worker.Join(&weights);
  for (int s = 0; s < steps && !::testing::Test::HasFatalFailure(); ++s) {
    worker.Step(&weights);
  }
  return weights;
}

bool SameBytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(AnyModelJobTest, JobConfigNamesTheFilesTensorsInTheirDataOrder) {
  TempDir dir;
  int port = 0;
  auto ps = StartServer(JobArgs(WriteInit(dir)), &port);
  ASSERT_GT(port, 0) << ps->output();
  EXPECT_NE(ps->output().find("the model: 6 tensors (conv1.weight [4,1,3,3], "
                              "conv1.bias [4], conv2.weight [8,4,3,3], ...), "
                              "2346 parameters"),
            std::string::npos)
      << ps->output();
  const std::optional<dp::v1::GetStatusResponse> status = StatusAt(port);
  ASSERT_TRUE(status.has_value());
  const ModelLayout want = Cnn();
  ASSERT_EQ(status->config().tensors_size(), 6);
  EXPECT_EQ(status->config().layers_size(), 0);
  for (int i = 0; i < 6; ++i) {
    const dp::v1::TensorSpec& t = status->config().tensors(i);
    EXPECT_EQ(t.name(), want.tensors()[i].name);
    EXPECT_EQ(std::vector<int64_t>(t.shape().begin(), t.shape().end()),
              want.tensors()[i].shape)
        << t.name();
  }
  EXPECT_EQ(status->config().model_fingerprint(), want.Fingerprint());
  // Another fingerprint (SimpleNet's) is refused at Register.
  auto stub = ConnectRaw(port);
  const grpc::Status wrong = RawRegister(
      *stub,
      RawRegisterRequest(0, ModelLayout::SimpleNet().Fingerprint(), kData));
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << wrong.error_message();
}

TEST(AnyModelJobTest, WeightsAreAdamsOnOneOrTwoShardsOverGrpcAndSharedMemory) {
  TempDir dir;
  const std::vector<std::string> args = JobArgs(WriteInit(dir));
  constexpr int kSteps = 5;
  const std::vector<float> want = ReferenceWeights(kSteps);
  ASSERT_FALSE(SameBytes(want, InitialWeights(want.size())));
  struct Plane {
    int shards;
    bool shared_memory;
  };
  for (const Plane plane : {Plane{1, false}, Plane{2, false}, Plane{1, true},
                            Plane{2, true}}) {
    SCOPED_TRACE(absl::StrCat(plane.shards, " shard(s), ",
                              plane.shared_memory ? "shared memory" : "gRPC"));
    const std::vector<float> got =
        RunSteps(args, plane.shards, plane.shared_memory, kSteps);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    EXPECT_TRUE(SameBytes(got, want));
  }
}

TEST(AnyModelJobTest, ACheckpointResumesToTheSameBytesAndExportsTheTensors) {
  TempDir dir;
  std::vector<std::string> args = JobArgs(WriteInit(dir));
  const std::string ckpt = dir.File("ckpt");
  args.push_back("--checkpoint_dir=" + ckpt);
  args.push_back("--checkpoint_every=2");
  const std::string step4 = ckpt + "/" + CheckpointFileName(4);
  {
    int port = 0;
    auto ps = StartServer(args, &port);
    HandWorker worker({port}, false);
    std::vector<float> weights;
    ASSERT_NO_FATAL_FAILURE(worker.Join(&weights));
    for (int s = 0; s < 4; ++s) ASSERT_NO_FATAL_FAILURE(worker.Step(&weights));
    ASSERT_TRUE(WaitForFile(step4, kJobTimeout));
    ps->Signal(SIGKILL);
    EXPECT_EQ(ps->Wait(kJobTimeout), 128 + SIGKILL);
  }
  int port = 0;
  auto ps = StartServer(args, &port);
  ASSERT_GT(port, 0) << ps->output();
  HandWorker worker({port}, false);
  std::vector<float> weights;
  ASSERT_NO_FATAL_FAILURE(worker.Join(&weights));
  EXPECT_TRUE(SameBytes(weights, ReferenceWeights(4)));
  for (int s = 0; s < 2; ++s) ASSERT_NO_FATAL_FAILURE(worker.Step(&weights));
  EXPECT_TRUE(SameBytes(weights, ReferenceWeights(6)));

  // The checkpoint exports as the file's tensors, by name and shape.
  const std::string out = dir.File("export.safetensors");
  Subprocess exporter({DP_PS_BINARY, "--export_checkpoint=" + step4,
                       "--save_model=" + out, args[0]});
  ASSERT_EQ(exporter.Wait(kJobTimeout), 0) << exporter.output();
  const std::string bytes = ReadModel(out);
  absl::StatusOr<ModelLayout> exported = SafetensorsModel(bytes);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->tensors(), Cnn().tensors());
  absl::StatusOr<std::vector<float>> values = DecodeSafetensors(Cnn(), bytes);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_TRUE(SameBytes(*values, ReferenceWeights(4)));

  // The checkpoints are another model's than SimpleNet: refused, kept.
  Subprocess simplenet({DP_PS_BINARY, "--port=0", "--checkpoint_dir=" + ckpt});
  EXPECT_EQ(simplenet.Wait(kJobTimeout), kExitConfigError);
  EXPECT_NE(simplenet.output().find("holds a different model"),
            std::string::npos)
      << simplenet.output();
  EXPECT_TRUE(ReadFile(step4).ok());
}

TEST(AnyModelJobTest, DpWorkerRefusesTheJobNamingThePythonWorker) {
  TempDir dir;
  int port = 0;
  auto ps = StartServer(JobArgs(WriteInit(dir)), &port);
  ASSERT_GT(port, 0) << ps->output();
  auto w = StartWorker(port, 0);
  EXPECT_EQ(w->Wait(kJobTimeout), kExitConfigError) << w->output();
  EXPECT_NE(w->output().find("the job's model is not an MLP (6 tensors"),
            std::string::npos)
      << w->output();
  EXPECT_NE(w->output().find("the dp_ps package (docs/python.md)"),
            std::string::npos)
      << w->output();
}

TEST(AnyModelJobTest, AnMlpJobNamesItsTensorsToo) {
  int port = 0;
  auto ps = StartServer({"--dataset=synthetic"}, &port);
  ASSERT_GT(port, 0) << ps->output();
  const std::optional<dp::v1::GetStatusResponse> status = StatusAt(port);
  ASSERT_TRUE(status.has_value());
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"fc1.weight", {256, 784}}, {"fc1.bias", {256}},
      {"fc2.weight", {128, 256}}, {"fc2.bias", {128}},
      {"fc3.weight", {10, 128}},  {"fc3.bias", {10}}};
  ASSERT_EQ(status->config().tensors_size(), 6);
  for (int i = 0; i < 6; ++i) {
    const dp::v1::TensorSpec& t = status->config().tensors(i);
    EXPECT_EQ(t.name(), want[i].first);
    EXPECT_EQ(std::vector<int64_t>(t.shape().begin(), t.shape().end()),
              want[i].second);
  }
  EXPECT_EQ(status->config().model_fingerprint(), 0x97d43e5109664b8aULL);
}

// A start from `file`: exit 2 and a message naming the file and `says`.
void ExpectRefused(const std::vector<std::string>& extra,
                   const std::string& file, const std::string& says) {
  std::vector<std::string> argv = {DP_PS_BINARY, "--port=0",
                                   "--init_model=" + file};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Subprocess ps(argv);
  EXPECT_EQ(ps.Wait(kJobTimeout), kExitConfigError) << says;
  EXPECT_NE(ps.output().find(file), std::string::npos) << ps.output();
  EXPECT_NE(ps.output().find(says), std::string::npos) << ps.output();
}

TEST(AnyModelJobTest, BadInitFilesAreRefusedByName) {
  TempDir dir;
  const ModelLayout layout = Cnn();
  const std::string good = EncodeSafetensors(
      layout, InitialWeights(layout.num_params()));
  const auto write = [&dir](const std::string& name,
                            const std::string& bytes) {
    const std::string path = dir.File(name);
    EXPECT_TRUE(WriteFileAtomic(path, bytes).ok());
    return path;
  };
  std::vector<float> nan = InitialWeights(layout.num_params());
  nan[layout.tensors()[3].offset + 2] = std::numeric_limits<float>::quiet_NaN();
  ExpectRefused({}, write("nan", EncodeSafetensors(layout, nan)),
                "tensor \"conv2.bias\" holds nan at index 2");
  ExpectRefused(
      {},
      write("f16", absl::StrReplaceAll(good, {{"{\"dtype\":\"F32\",\"shape\":"
                                               "[8]",
                                               "{\"dtype\":\"F16\",\"shape\":"
                                               "[8]"}})),
      "tensor \"conv2.bias\" has dtype F16");
  ExpectRefused({}, write("truncated", good.substr(0, 40)), "truncated");
  ExpectRefused({}, write("empty", std::string("\x02\0\0\0\0\0\0\0{}", 10)),
                "a model needs a tensor, got none");
  // conv1.bias's data said to start where conv1.weight's does (the
  // header's length is kept).
  ExpectRefused({}, write("overlap", absl::StrReplaceAll(
                                         good, {{"[144,160]", "[  0, 16]"}})),
                "overlapping data_offsets");
  ExpectRefused({"--layers=784,10"},
                write("cnn", good),
                "--layers=784,10 and --init_model=");
}

}  // namespace
}  // namespace dp
