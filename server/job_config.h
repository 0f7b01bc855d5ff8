// The job's hyper-parameters, owned by dp-ps and handed to workers, and
// their wire form.
#ifndef DP_SERVER_JOB_CONFIG_H_
#define DP_SERVER_JOB_CONFIG_H_

#include <string>

#include "absl/status/status.h"
#include "common/data_order.h"
#include "common/tensor_codec.h"
#include "proto/dp.pb.h"
#include "server/adam.h"

namespace dp {

// schedule.num_samples is learnt from the first worker that registers.
struct JobConfig {
  Schedule schedule;
  std::string dataset = "fashion-mnist";
  AdamOptions adam;
  Encoding grad_encoding = Encoding::kF32;
  // How dp-ps sends the weights; it keeps and updates them in float32.
  Encoding weight_encoding = Encoding::kF32;
};

void ToProto(const JobConfig& config, dp::v1::JobConfig* out);
JobConfig FromProto(const dp::v1::JobConfig& config);

// OK when a job saved with `saved` can resume under `wanted`: everything that
// shapes the computation must match; epochs and max_steps may change, since
// the data order of an epoch does not depend on them. FAILED_PRECONDITION
// naming every differing setting otherwise.
absl::Status CheckResumable(const JobConfig& saved, const JobConfig& wanted);

}  // namespace dp

#endif  // DP_SERVER_JOB_CONFIG_H_
