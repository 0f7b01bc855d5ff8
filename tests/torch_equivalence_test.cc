// The user's own MLP trained by dp-ps ends where PyTorch's own training of
// it ends: tests/golden/make_user_mlp_golden.py trained a 20-64-32-3 MLP
// with torch.optim.AdamW, a warm-up and cosine LambdaLR and
// clip_grad_norm_, from init.safetensors on the .npy files beside it, in
// file order; dp-ps runs that job on real processes, 2 workers x 16.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/model_layout.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "tests/job_runner.h"

namespace dp {
namespace {

const std::string kGolden = std::string(DP_GOLDEN_DIR) + "/user_mlp";

std::vector<float> Weights(const ModelLayout& layout, const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return {};
  absl::StatusOr<std::vector<float>> params = DecodeSafetensors(layout, *bytes);
  EXPECT_TRUE(params.ok()) << params.status();
  return params.ok() ? *params : std::vector<float>{};
}

// The job of the golden file on `workers` workers: always 2 micro-batches
// of 16 a step (the workers split them, or wait), so that every worker
// count trains the same model to the bit.
std::string Trained(const TempDir& dir, int workers) {
  const std::string model =
      dir.File(absl::StrCat("model-", workers, ".safetensors"));
  const JobResult r =
      RunJob({"--layers=20,64,32,3", "--dataset=npy", "--shuffle=false",
              "--global_batch=32", "--micro_batch=16", "--epochs=3",
              "--max_steps=20", "--init_model=" + kGolden + "/init.safetensors",
              "--optimizer=adamw", "--lr=0.01", "--weight_decay=0.05",
              "--lr_schedule=cosine", "--warmup_steps=5", "--lr_min=0.001",
              "--clip_grad_norm=0.5", "--save_model=" + model},
             workers, {"--data_dir=" + kGolden});
  EXPECT_EQ(r.ps_exit, 0) << r.ps_output;
  return model;
}

TEST(TorchEquivalenceTest,
     AnMlpWithAdamWCosineAndClippingEndsWherePyTorchDoes) {
  const ModelLayout layout = ModelLayout::Mlp({20, 64, 32, 3});
  TempDir dir;
  const std::string model = Trained(dir, 2);
  const std::vector<float> got = Weights(layout, model);
  const std::vector<float> want =
      Weights(layout, kGolden + "/trained.safetensors");
  const std::vector<float> init =
      Weights(layout, kGolden + "/init.safetensors");
  ASSERT_EQ(got.size(), static_cast<size_t>(layout.num_params()));
  ASSERT_EQ(want.size(), got.size());
  int far = 0;
  double worst = 0, moved = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(double{got[i]} - want[i]);
    const double rel = diff / std::max(std::fabs(double{want[i]}), 1e-2);
    worst = std::max(worst, rel);
    moved = std::max(moved, std::fabs(double{want[i]} - init[i]));
    if (rel > 1e-4) ++far;
  }
  std::printf("largest relative difference to PyTorch: %.3g\n", worst);
  EXPECT_EQ(far, 0) << "weights beyond a relative 1e-4 of PyTorch's; largest "
                    << worst;
  EXPECT_GT(moved, 1e-2) << "training did not move the weights";
  // One model, to the bit, on 1, 2 and 4 workers.
  const std::string two = ReadModel(model);
  for (int workers : {1, 4}) {
    EXPECT_TRUE(ReadModel(Trained(dir, workers)) == two)
        << workers << " workers trained another model";
  }
}

}  // namespace
}  // namespace dp
