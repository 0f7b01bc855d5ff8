// What every process of a job agrees on about its computation: the data
// schedule, the data set and the encodings on the wire. dp-ps owns it and
// hands it to workers when they register; its wire form is dp.v1.JobConfig.
// Also the evaluation reports rank 0 sends back.
#ifndef DP_COMMON_JOB_PLAN_H_
#define DP_COMMON_JOB_PLAN_H_

#include <cstdint>
#include <string>

#include "common/data_order.h"
#include "common/tensor_codec.h"

namespace dp {
namespace v1 {
class JobConfig;
}  // namespace v1

struct JobPlan {
  // num_samples is the data set's: dp-ps learns it from the first worker
  // that registers, a worker from its own data.
  Schedule schedule;
  std::string dataset = "fashion-mnist";
  Encoding grad_encoding = Encoding::kF32;
  // How dp-ps sends the weights; it keeps and updates them in float32.
  Encoding weight_encoding = Encoding::kF32;
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

// The plan's fields of dp.v1.JobConfig (all but lr), both ways.
void PlanToProto(const JobPlan& plan, dp::v1::JobConfig* out);
JobPlan PlanFromProto(const dp::v1::JobConfig& config);

}  // namespace dp

#endif  // DP_COMMON_JOB_PLAN_H_
