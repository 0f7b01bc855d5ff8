// Whole jobs on the user's own model and data: dp-ps --layers and
// --dataset=npy with real dp-ps and dp-worker processes, the .npy files
// written by the test. The same job on 1 and 2 workers saves the same bytes
// and learns; bad files make the worker exit 2 naming the file and problem.
#include <csignal>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/model_layout.h"
#include "common/random.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"
#include "tests/job_runner.h"
#include "tests/npy_files.h"
#include "worker/cpu_backend.h"

namespace dp {
namespace {

constexpr int kFeatures = 20;
constexpr int kClasses = 3;
constexpr int kTrainSamples = 480;
constexpr int kTestSamples = 120;
const char kLayers[] = "--layers=20,64,32,3";

// Samples of class i mod 3 with N(0, 1) features, feature k shifted by +2
// when k mod 3 is the class: an MLP can learn it, and the first epoch's
// loss is well above the last's.
struct Samples {
  std::vector<float> x;  // (n, kFeatures)
  std::vector<int64_t> y;
};
Samples MakeSamples(int n, uint64_t stream) {
  Rng rng(7, stream);
  Samples s;
  for (int i = 0; i < n; ++i) {
    const int label = i % kClasses;
    s.y.push_back(label);
    for (int k = 0; k < kFeatures; ++k) {
      s.x.push_back(static_cast<float>(rng.Normal()) +
                    (k % kClasses == label ? 2.0f : 0.0f));
    }
  }
  return s;
}

void WriteSplit(const TempDir& dir, const std::string& prefix,
                const Samples& s) {
  const int64_t n = static_cast<int64_t>(s.y.size());
  WriteBytes(dir.File(prefix + "_x.npy"),
             NpyBytes("<f4", {n, kFeatures}, RawBytes(s.x)));
  WriteBytes(dir.File(prefix + "_y.npy"), NpyBytes("<i8", {n}, RawBytes(s.y)));
}

// A data directory of train (and, with `test`, test) files.
void WriteData(const TempDir& dir, bool test) {
  WriteSplit(dir, "train", MakeSamples(kTrainSamples, 1));
  if (test) WriteSplit(dir, "test", MakeSamples(kTestSamples, 2));
}

// The mean cross-entropy of `params` on the training samples, computed by
// the CPU backend, the reference of the workers' arithmetic.
double TrainLoss(const ModelLayout& layout, const std::vector<float>& params) {
  const Samples s = MakeSamples(kTrainSamples, 1);
  const std::vector<int32_t> labels(s.y.begin(), s.y.end());
  BackendOptions options;
  options.max_batch = kTrainSamples;
  auto backend = CpuBackend::Create(layout, options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE((*backend)->SetWeights(params).ok());
  absl::StatusOr<EvalResult> eval = (*backend)->Evaluate(s.x, labels);
  EXPECT_TRUE(eval.ok()) << eval.status();
  if (!eval.ok()) return std::numeric_limits<double>::quiet_NaN();
  return eval->loss_sum / eval->count;
}

// The job of the README's section, small: 3 epochs of global batch 32 in
// micro-batches of 16, so that 1 and 2 workers split each step differently.
JobResult RunUserJob(const TempDir& data, const std::string& model, int workers,
                     int shards) {
  return RunJob({kLayers, "--dataset=npy", "--epochs=3", "--global_batch=32",
                 "--micro_batch=16", "--seed=5", "--save_model=" + model},
                workers, {"--data_dir=" + data.path()}, shards);
}

TEST(UserModelJobTest, OneAndTwoWorkersSaveTheSameBytesAndTheLossFalls) {
  TempDir data;
  WriteData(data, /*test=*/true);
  // 1 worker, 2 workers, and 2 workers of a model split over 2 dp-ps.
  struct Run {
    int workers, shards;
  };
  const Run runs[] = {{1, 1}, {2, 1}, {2, 2}};
  std::string saved[3];
  for (int i = 0; i < 3; ++i) {
    const auto [workers, shards] = runs[i];
    const std::string model = data.File(absl::StrCat("model", i));
    const JobResult r = RunUserJob(data, model, workers, shards);
    ASSERT_EQ(r.ps_exit, 0) << r.ps_output;
    EXPECT_EQ(r.worker_exits, std::vector<int>(workers, 0));
    EXPECT_NE(r.ps_output.find("the model: MLP 20,64,32,3, 3523 parameters"),
              std::string::npos)
        << r.ps_output;
    // The test files are evaluated: rank 0 reports the end.
    EXPECT_NE(r.ps_output.find("final test accuracy: "), std::string::npos)
        << r.ps_output;
    saved[i] = ReadModel(model);
  }
  ASSERT_FALSE(saved[0].empty());
  EXPECT_TRUE(saved[0] == saved[1]) << "1 and 2 workers saved different models";
  EXPECT_TRUE(saved[0] == saved[2])
      << "2 dp-ps shards saved another model than 1";

  // Read back with the layout the file itself describes, as --init_model
  // without --layers does; the loss of the saved weights is well below that
  // of the initial ones (--seed=5).
  absl::StatusOr<ModelLayout> read = SafetensorsModel(saved[0]);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->is_mlp());
  EXPECT_EQ(read->dims(), (std::vector<int>{20, 64, 32, 3}));
  const ModelLayout layout = *read;
  absl::StatusOr<std::vector<float>> trained =
      DecodeSafetensors(layout, saved[0]);
  ASSERT_TRUE(trained.ok()) << trained.status();
  const double before = TrainLoss(layout, InitParams(layout, 5));
  const double after = TrainLoss(layout, *trained);
  std::printf("training loss: %.4f at the start, %.4f at the end\n", before,
              after);
  EXPECT_LT(after, 0.5 * before);
}

TEST(UserModelJobTest, WithoutTestFilesRankZeroSaysSoOnceAndDpPsDoesNotWait) {
  TempDir data;
  WriteData(data, /*test=*/false);
  // A wait for an evaluation that cannot come would outlast kJobTimeout.
  // Two epochs: an epoch's end, where rank 0 would evaluate, comes first.
  int port = 0;
  auto ps =
      StartServer({kLayers, "--dataset=npy", "--epochs=2", "--batch_size=16",
                   "--workers=1", "--final_eval_timeout_s=3600"},
                  &port);
  auto w = StartWorker(port, 0, {"--data_dir=" + data.path()});
  EXPECT_EQ(w->Wait(kJobTimeout), 0) << w->output();
  EXPECT_EQ(ps->Wait(kJobTimeout), 0) << ps->output();
  const std::string said = "rank 0: no test set (";
  const std::string out = w->output();
  const size_t first = out.find(said);
  EXPECT_NE(first, std::string::npos) << out;
  EXPECT_EQ(out.find(said, first + 1), std::string::npos)
      << "said more than once:\n"
      << out;
  EXPECT_NE(ps->output().find("no final test accuracy: rank 0 has no test set"),
            std::string::npos)
      << ps->output();
}

TEST(UserModelJobTest, TheLayoutComesFromTheInitModelAndMustMatchLayers) {
  TempDir data;
  WriteData(data, /*test=*/false);
  const ModelLayout layout = ModelLayout::Mlp({20, 64, 32, 3});
  const std::string init = data.File("init.safetensors");
  ASSERT_TRUE(SaveSafetensors(init, layout, InitParams(layout, 9)).ok());
  const JobResult r = RunJob({"--dataset=npy", "--max_steps=5",
                              "--batch_size=16", "--init_model=" + init},
                             1, {"--data_dir=" + data.path()});
  ASSERT_EQ(r.ps_exit, 0) << r.ps_output;
  EXPECT_NE(r.ps_output.find("the model: MLP 20,64,32,3"), std::string::npos)
      << r.ps_output;

  // Both, disagreeing: refused before dp-ps listens. So are widths that
  // make no MLP.
  Subprocess both({DP_PS_BINARY, "--port=0", "--layers=20,64,31,3",
                   "--init_model=" + init});
  EXPECT_EQ(both.Wait(kJobTimeout), kExitConfigError);
  EXPECT_NE(both.output().find("tensor \"fc2.weight\" has shape [32,64], "
                               "expected [31,64]"),
            std::string::npos)
      << both.output();
  for (const char* layers : {"--layers=20", "--layers=20,0,3"}) {
    Subprocess ps({DP_PS_BINARY, "--port=0", layers});
    EXPECT_EQ(ps.Wait(kJobTimeout), kExitConfigError) << layers;
    EXPECT_NE(ps.output().find("configuration error: --layers: "),
              std::string::npos)
        << ps.output();
  }
}

TEST(UserModelJobTest, ACheckpointOfOtherLayersIsRefusedAndKept) {
  TempDir data;
  WriteData(data, /*test=*/false);
  const std::string ckpt = data.File("ckpt");
  const std::string model = data.File("model");
  const JobResult r =
      RunJob({kLayers, "--dataset=npy", "--max_steps=4", "--batch_size=16",
              "--checkpoint_dir=" + ckpt, "--save_model=" + model},
             1, {"--data_dir=" + data.path()});
  ASSERT_EQ(r.ps_exit, 0) << r.ps_output;
  const std::string file = ckpt + "/" + CheckpointFileName(4);
  ASSERT_FALSE(ReadModel(file).empty());
  // --export_checkpoint with the job's --layers gives the model it saved.
  const std::string exported = data.File("exported");
  Subprocess ex({DP_PS_BINARY, kLayers, "--export_checkpoint=" + file,
                 "--save_model=" + exported});
  EXPECT_EQ(ex.Wait(kJobTimeout), 0) << ex.output();
  EXPECT_TRUE(ReadModel(exported) == ReadModel(model))
      << "the export is not the saved model";
  // Another model on the same directory: neither resumed nor started
  // afresh over it (which would remove it).
  Subprocess ps({DP_PS_BINARY, "--port=0", "--layers=20,8,3", "--dataset=npy",
                 "--checkpoint_dir=" + ckpt});
  EXPECT_EQ(ps.Wait(kJobTimeout), kExitConfigError);
  EXPECT_NE(ps.output().find(file + ": the checkpoint holds a different model"),
            std::string::npos)
      << ps.output();
  EXPECT_FALSE(ReadModel(file).empty()) << "the checkpoint is gone";
}

TEST(UserModelJobTest, AModelLargerThanSimpleNetTravelsOverGrpc) {
  TempDir data;
  WriteData(data, /*test=*/true);
  // 568,323 parameters, more than SimpleNet's 235,146 that the workers'
  // channels are first made for; gRPC only, so the weights and gradients
  // are messages.
  const JobResult r =
      RunJob({"--layers=20,2048,256,3", "--dataset=npy", "--max_steps=3",
              "--batch_size=16"},
             2, {"--data_dir=" + data.path(), "--data_plane=grpc"});
  ASSERT_EQ(r.ps_exit, 0) << r.ps_output;
  EXPECT_EQ(r.worker_exits, (std::vector<int>{0, 0}));
  EXPECT_NE(r.ps_output.find("the model: MLP 20,2048,256,3, 568323 parameters"),
            std::string::npos)
      << r.ps_output;
}

// One bad input: what the test writes over a good data directory, and what
// the worker's error must say.
struct BadInput {
  std::string name;
  std::string file;   // written into the data directory
  std::string bytes;  // its contents
  std::string error;  // in the worker's output
};

std::vector<BadInput> BadInputs() {
  Samples s = MakeSamples(kTrainSamples, 1);
  std::vector<BadInput> cases;
  {
    Samples bad = s;
    bad.y[5] = kClasses;
    cases.push_back({"LabelOutOfRange", "train_y.npy",
                     NpyBytes("<i8", {kTrainSamples}, RawBytes(bad.y)),
                     "train_y.npy: label 3 of sample 5 is outside [0, 3)"});
  }
  {
    Samples bad = s;
    bad.x[7 * kFeatures + 4] = std::numeric_limits<float>::infinity();
    cases.push_back(
        {"InfiniteFeature", "train_x.npy",
         NpyBytes("<f4", {kTrainSamples, kFeatures}, RawBytes(bad.x)),
         "train_x.npy: feature 4 of sample 7 is infinite"});
  }
  cases.push_back(
      {"FortranOrder", "train_x.npy",
       NpyBytes("<f4", {kTrainSamples, kFeatures}, RawBytes(s.x), 1, true),
       "train_x.npy is in Fortran (column-major) order"});
  cases.push_back({"Truncated", "train_x.npy",
                   NpyBytes("<f4", {kTrainSamples, kFeatures}, RawBytes(s.x))
                       .substr(0, 1000),
                   "train_x.npy is truncated"});
  cases.push_back({"NotNpy", "train_y.npy", "label\n0\n1\n2\n",
                   "train_y.npy is not a valid .npy file"});
  // Each sample's features twice: 40 where the first layer takes 20.
  const auto doubled = [](const std::vector<float>& x) {
    std::vector<float> out;
    for (size_t i = 0; i < x.size(); i += kFeatures) {
      for (int twice = 0; twice < 2; ++twice) {
        out.insert(out.end(), x.begin() + i, x.begin() + i + kFeatures);
      }
    }
    return out;
  };
  cases.push_back(
      {"FeaturesDoNotMatchTheFirstLayer", "train_x.npy",
       NpyBytes("<f4", {kTrainSamples, 2 * kFeatures}, RawBytes(doubled(s.x))),
       "train_x.npy has 40 features per sample, but the model's first layer "
       "takes 20"});
  cases.push_back({"TestHasOtherFeatures", "test_x.npy",
                   NpyBytes("<f4", {kTestSamples, 2 * kFeatures},
                            RawBytes(doubled(MakeSamples(kTestSamples, 2).x))),
                   "train_x.npy has 20 features per sample"});
  return cases;
}

// Names the case in gtest's output, not its bytes.
void PrintTo(const BadInput& bad, std::ostream* os) { *os << bad.name; }

class BadInputJobTest : public testing::TestWithParam<BadInput> {};

TEST_P(BadInputJobTest, TheWorkerExits2NamingTheFileAndTheProblem) {
  const BadInput& bad = GetParam();
  TempDir data;
  WriteData(data, /*test=*/true);
  WriteBytes(data.File(bad.file), bad.bytes);
  int port = 0;
  auto ps = StartServer({kLayers, "--dataset=npy", "--workers=1"}, &port);
  auto w = StartWorker(port, 0, {"--data_dir=" + data.path()});
  EXPECT_EQ(w->Wait(kJobTimeout), kExitConfigError) << w->output();
  EXPECT_NE(w->output().find(bad.error), std::string::npos)
      << "expected \"" << bad.error << "\" in:\n"
      << w->output();
  ps->Signal(SIGTERM);
  ps->Wait(kJobTimeout);
}

INSTANTIATE_TEST_SUITE_P(Files, BadInputJobTest, testing::ValuesIn(BadInputs()),
                         [](const testing::TestParamInfo<BadInput>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace dp
