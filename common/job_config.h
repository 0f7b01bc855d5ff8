// The job as every process of it sees it: its configuration (owned by dp-ps,
// handed to workers when they register; wire form dp.v1.JobConfig), the
// optimiser state it trains (what a checkpoint holds) and rank 0's
// evaluation reports. Plain values: no gRPC or protobuf types here.
#ifndef DP_COMMON_JOB_CONFIG_H_
#define DP_COMMON_JOB_CONFIG_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/data_order.h"
#include "common/micro_batch_tree.h"
#include "common/model_layout.h"
#include "common/tensor_codec.h"

namespace dp {

// How the learning rate of each update moves: torch.optim.lr_scheduler's
// LambdaLR stepped once after every update (server/lr_schedule.h).
// Numbered as dp.v1.LrSchedule.
enum class LrScheduleKind { kConstant = 0, kCosine = 1, kStep = 2 };

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  int64_t warmup_steps = 0;  // linear warm-up over the first W updates
  double lr_min = 0.0;       // cosine: the rate it ends at
  int64_t step_every = 0;    // step: updates between decays (>= 1)
  double gamma = 0.1;        // step: the factor of each decay
  bool operator==(const LrSchedule& o) const {
    return kind == o.kind && warmup_steps == o.warmup_steps &&
           lr_min == o.lr_min && step_every == o.step_every && gamma == o.gamma;
  }
};

// The optimiser's hyper-parameters: torch.optim.Adam (weight decay as L2,
// added to the gradient) or torch.optim.AdamW (decoupled: the weights
// shrink by lr * weight_decay before the update), the learning-rate
// schedule and the clipping of the averaged gradient by its global L2 norm
// (torch.nn.utils.clip_grad_norm_; 0 = off).
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // AdamW
  LrSchedule schedule;
  double clip_grad_norm = 0.0;
  bool operator==(const AdamOptions& o) const {
    return lr == o.lr && beta1 == o.beta1 && beta2 == o.beta2 && eps == o.eps &&
           weight_decay == o.weight_decay &&
           decoupled_weight_decay == o.decoupled_weight_decay &&
           schedule == o.schedule && clip_grad_norm == o.clip_grad_norm;
  }
};

struct JobConfig {
  // num_samples is the data set's: dp-ps learns it from the first worker
  // that registers, a worker from its own data.
  Schedule schedule;
  std::string dataset = "fashion-mnist";
  // The MLP's widths, inputs first (ModelLayout::Mlp); SimpleNet's by
  // default. Unused when `tensors` is not empty.
  std::vector<int> layers = {784, 256, 128, 10};
  // A model that is not an MLP: its tensors' names and shapes, in the
  // order of the flat vector (offset and size 0; LayoutOfJob lays them
  // out). Empty for an MLP.
  std::vector<TensorInfo> tensors;
  AdamOptions adam;
  Encoding grad_encoding = Encoding::kF32;
  // How dp-ps sends the weights; it keeps and updates them in float32.
  Encoding weight_encoding = Encoding::kF32;
  // Steps wait while fewer workers are live (0 counts as 1: live_minimum).
  int min_workers = 0;
  int live_minimum() const { return std::max(min_workers, 1); }
  bool operator==(const JobConfig& o) const {
    return schedule == o.schedule && dataset == o.dataset &&
           layers == o.layers && tensors == o.tensors && adam == o.adam &&
           grad_encoding == o.grad_encoding &&
           weight_encoding == o.weight_encoding &&
           live_minimum() == o.live_minimum();
  }
};

// The optimiser state: what a checkpoint holds.
struct TrainingState {
  int64_t step = 0;  // number of updates applied = weights version
  std::vector<float> params;
  std::vector<float> m, v;  // Adam moments
};

// Rank 0's evaluation of the weights of version `step` on the test set.
struct EvalReport {
  int64_t step = 0;
  int epoch = 0;  // epochs completed
  double accuracy = 0.0;
  double loss = 0.0;
  int64_t num_samples = 0;
  bool final = false;  // of the job's last step
};

}  // namespace dp

#endif  // DP_COMMON_JOB_CONFIG_H_
