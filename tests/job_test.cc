// Whole jobs with real processes over real loopback gRPC: dp-ps and
// dp-worker binaries, Fashion-MNIST from Debian's dataset-fashion-mnist.
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dataset.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "common/model_layout.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/job_runner.h"

namespace dp {
namespace {

TEST(JobTest, TwoWorkersOneEpochOfFashionMnistReachTestAccuracy084) {
  TempDir dir;
  const std::string model = dir.File("model.safetensors");
  JobResult r = RunJob({"--epochs=1", "--batch_size=64", "--seed=1",
                        "--dataset=fashion-mnist", "--save_model=" + model},
                       2);
  ASSERT_EQ(r.ps_exit, 0) << r.ps_output;
  EXPECT_EQ(r.worker_exits, (std::vector<int>{0, 0}));
  const size_t at = r.ps_output.find("final test accuracy: ");
  ASSERT_NE(at, std::string::npos) << r.ps_output;
  double accuracy = 0;
  ASSERT_TRUE(absl::SimpleAtod(
      r.ps_output.substr(at + 21, r.ps_output.find('\n', at) - at - 21),
      &accuracy));
  std::printf("test accuracy after 1 epoch: %.4f\n", accuracy);
  EXPECT_GE(accuracy, 0.84);

  // The saved model: safetensors header with PyTorch names, shapes, offsets.
  auto bytes = ReadFile(model);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_GE(bytes->size(), 8u);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes->data(), 8);
  ASSERT_LE(8 + header_len, bytes->size());
  const std::string header = bytes->substr(8, header_len);
  const ModelLayout layout = ModelLayout::SimpleNet();
  for (const TensorInfo& t : layout.tensors()) {
    std::string shape;
    for (int64_t d : t.shape)
      absl::StrAppend(&shape, shape.empty() ? "" : ",", d);
    const std::string expected =
        absl::StrCat("\"", t.name, "\":{\"dtype\":\"F32\",\"shape\":[", shape,
                     "],\"data_offsets\":[", t.offset * 4, ",",
                     (t.offset + t.size) * 4, "]}");
    EXPECT_NE(header.find(expected), std::string::npos)
        << expected << " not in " << header;
  }
  EXPECT_EQ(bytes->size(), 8 + header_len + layout.num_params() * 4);
  EXPECT_TRUE(DecodeSafetensors(layout, *bytes).ok());
}

// Test accuracy after one epoch of 2 workers x 64 with the given encodings.
void ExpectOneEpochAccuracy084(const std::string& grad,
                               const std::string& weights) {
  JobResult r =
      RunJob({"--epochs=1", "--batch_size=64", "--seed=1",
              "--grad_encoding=" + grad, "--weight_encoding=" + weights},
             2);
  ASSERT_EQ(r.ps_exit, 0) << r.ps_output;
  const size_t at = r.ps_output.find("final test accuracy: ");
  ASSERT_NE(at, std::string::npos) << r.ps_output;
  const double accuracy = std::stod(r.ps_output.substr(at + 21));
  std::printf("%s gradients, %s weights: test accuracy after 1 epoch %.4f\n",
              grad.c_str(), weights.c_str(), accuracy);
  EXPECT_GE(accuracy, 0.84);
}

TEST(JobTest, Bf16GradientsOneEpochReachTestAccuracy084) {
  ExpectOneEpochAccuracy084("bf16", "f32");
}

TEST(JobTest, Bf16GradientsAndWeightsOneEpochReachTestAccuracy084) {
  ExpectOneEpochAccuracy084("bf16", "bf16");
}

TEST(JobTest, SameJobTwiceSavesByteIdenticalModels) {
  TempDir dir;
  std::string files[3];
  // Runs 1 and 2: the fused protocol; run 3: plain Push + Barrier + Pull.
  for (int run = 0; run < 3; ++run) {
    files[run] = dir.File(absl::StrCat("model", run, ".safetensors"));
    std::vector<std::string> worker_args;
    if (run == 2) worker_args.push_back("--protocol=plain");
    JobResult r = RunJob({"--max_steps=40", "--batch_size=32", "--seed=5",
                          "--save_model=" + files[run]},
                         2, worker_args);
    ASSERT_EQ(r.ps_exit, 0) << r.ps_output;
  }
  auto a = ReadFile(files[0]), b = ReadFile(files[1]), c = ReadFile(files[2]);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_TRUE(*a == *b) << "two identical fused runs differ";
  EXPECT_TRUE(*a == *c) << "plain and fused protocols differ";
  // And training moved the weights away from the initialisation.
  auto params = DecodeSafetensors(ModelLayout::SimpleNet(), *a);
  ASSERT_TRUE(params.ok());
  EXPECT_NE(*params, InitParams(ModelLayout::SimpleNet(), 5));
}

// --save_model_every takes models out while the job runs: with {step} in
// the path, a file per save, each exactly the model of a job that ends
// there (the data order does not depend on --max_steps), the last one the
// final model. Over shared memory and gRPC alike.
TEST(JobTest, ModelsTakenOutMidRunAreTheWeightsOfTheirSteps) {
  TempDir dir;
  const std::vector<std::string> job = {"--batch_size=16", "--seed=4",
                                        "--dataset=synthetic", "--epochs=50"};
  std::vector<std::string> every = job;
  every.insert(every.end(),
               {"--max_steps=60", "--save_model_every=20",
                "--save_model=" + dir.File("every-{step}.safetensors")});
  const JobResult r = RunJob(every, 2, {"--data_plane=grpc"});
  ASSERT_EQ(r.ps_exit, 0) << r.ps_output;
  for (int step : {20, 40}) {
    EXPECT_NE(r.ps_output.find(
                  absl::StrFormat("saved the model of step %d to", step)),
              std::string::npos)
        << r.ps_output;
  }
  for (int step : {20, 40, 60}) {
    SCOPED_TRACE(step);
    std::vector<std::string> until = job;
    const std::string reference =
        dir.File(absl::StrCat("until-", step, ".safetensors"));
    until.insert(until.end(), {absl::StrCat("--max_steps=", step),
                               "--save_model=" + reference});
    const JobResult u = RunJob(until, 2, {"--data_plane=shm"});
    ASSERT_EQ(u.ps_exit, 0) << u.ps_output;
    const std::string taken =
        ReadModel(dir.File(absl::StrCat("every-", step, ".safetensors")));
    ASSERT_FALSE(taken.empty());
    EXPECT_TRUE(taken == ReadModel(reference))
        << "the model of step " << step << " is not that job's";
  }
}

TEST(JobTest, SaveModelEveryNeedsTheFileAndOneDpPs) {
  Subprocess alone({DP_PS_BINARY, "--save_model_every=10"});
  EXPECT_EQ(alone.Wait(absl::Seconds(30)), kExitConfigError);
  EXPECT_NE(alone.output().find("--save_model_every needs --save_model"),
            std::string::npos)
      << alone.output();
  Subprocess sharded({DP_PS_BINARY, "--save_model_every=10",
                      "--save_model=/tmp/m.safetensors", "--shards=2",
                      "--shard=0"});
  EXPECT_EQ(sharded.Wait(absl::Seconds(30)), kExitConfigError);
  EXPECT_NE(sharded.output().find("the whole model in one dp-ps"),
            std::string::npos)
      << sharded.output();
}

TEST(JobTest, UnknownFlagIsAConfigurationErrorNamingTheFlag) {
  Subprocess ps({DP_PS_BINARY, "--bogus_flag=1"});
  EXPECT_EQ(ps.Wait(absl::Seconds(30)), kExitConfigError);
  EXPECT_NE(ps.output().find("--bogus_flag"), std::string::npos) << ps.output();
  Subprocess w({DP_WORKER_BINARY, "--rank=zero"});
  EXPECT_EQ(w.Wait(absl::Seconds(30)), kExitConfigError);
  EXPECT_NE(w.output().find("'zero'"), std::string::npos) << w.output();
}

TEST(JobTest, UnknownBackendFailsBeforeConnecting) {
  // No dp-ps is listening on port 1: the worker must not even try.
  Subprocess w(
      {DP_WORKER_BINARY, "--rank=0", "--backend=gpu", "--ps=127.0.0.1:1"});
  EXPECT_EQ(w.Wait(absl::Seconds(30)), kExitConfigError);
  EXPECT_NE(w.output().find("unknown backend \"gpu\""), std::string::npos)
      << w.output();
}

TEST(JobTest, HelpAndVersionExitZero) {
  for (const char* bin : {DP_PS_BINARY, DP_WORKER_BINARY}) {
    Subprocess help({bin, "--help"});
    EXPECT_EQ(help.Wait(absl::Seconds(30)), 0);
    EXPECT_NE(help.output().find("Usage: "), std::string::npos)
        << help.output();
    Subprocess version({bin, "--version"});
    EXPECT_EQ(version.Wait(absl::Seconds(30)), 0);
    EXPECT_NE(version.output().find(DP_VERSION), std::string::npos);
  }
}

TEST(JobTest, BusyPortIsAClearErrorAndTheFirstServerKeepsServing) {
  int port = 0;
  auto first = StartServer({"--workers=1", "--max_steps=20"}, &port);
  ASSERT_GT(port, 0);
  Subprocess second(
      {DP_PS_BINARY, "--host=127.0.0.1", absl::StrCat("--port=", port)});
  EXPECT_EQ(second.Wait(absl::Seconds(30)), kExitFailure);
  EXPECT_NE(second.output().find(absl::StrCat("127.0.0.1:", port)),
            std::string::npos)
      << second.output();
  EXPECT_NE(second.output().find("in use"), std::string::npos);
  // The first still trains a whole (short) job.
  auto w = StartWorker(port, 0);
  EXPECT_EQ(w->Wait(kJobTimeout), 0) << w->output();
  EXPECT_EQ(first->Wait(kJobTimeout), 0) << first->output();
}

TEST(JobTest, WorkerWithMissingDataDirExitsWithTheDirectoryNamed) {
  int port = 0;
  auto ps = StartServer({"--workers=1"}, &port);
  auto w = StartWorker(port, 0, {"--data_dir=/nonexistent/dp-data"});
  EXPECT_EQ(w->Wait(kJobTimeout), kExitConfigError);
  EXPECT_NE(w->output().find("/nonexistent/dp-data"), std::string::npos)
      << w->output();
  ps->Signal(SIGTERM);
  EXPECT_EQ(ps->Wait(kJobTimeout), kExitInterrupted);
}

TEST(JobTest, WorkerWithGarbageIdxFileExitsNamingTheFile) {
  TempDir dir;
  for (const char* name :
       {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    ASSERT_TRUE(
        WriteFileAtomic(dir.File(name), "this is not an IDX file").ok());
  }
  int port = 0;
  auto ps = StartServer({"--workers=1"}, &port);
  auto w = StartWorker(port, 0, {"--data_dir=" + dir.path()});
  EXPECT_EQ(w->Wait(kJobTimeout), kExitConfigError);
  EXPECT_NE(w->output().find("train-images-idx3-ubyte"), std::string::npos)
      << w->output();
  ps->Signal(SIGTERM);
  ps->Wait(kJobTimeout);
}

TEST(JobTest, WorkerWithRankOutOfRangeIsRefused) {
  int port = 0;
  auto ps = StartServer({"--workers=2"}, &port);
  auto w = StartWorker(port, 2);
  EXPECT_EQ(w->Wait(kJobTimeout), kExitConfigError);
  EXPECT_NE(w->output().find("rank 2 is out of range"), std::string::npos)
      << w->output();
  ps->Signal(SIGTERM);
  ps->Wait(kJobTimeout);
}

TEST(JobTest, RankComesFromJobCompletionIndexAndFlagsWinOverEnvironment) {
  int port = 0;
  auto ps = StartServer({"--workers=1", "--max_steps=3"}, &port);
  // DP_BACKEND=bogus would fail; the flag --backend=cpu wins over it.
  Subprocess w({DP_WORKER_BINARY, absl::StrCat("--ps=127.0.0.1:", port),
                "--backend=cpu"},
               {"JOB_COMPLETION_INDEX=0", "DP_BACKEND=bogus"});
  EXPECT_EQ(w.Wait(kJobTimeout), 0) << w.output();
  EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
}

}  // namespace
}  // namespace dp
