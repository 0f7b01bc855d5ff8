// The checkpoint file of dp-ps: weights, Adam m and v, step, job
// configuration and data fingerprint, with a checksum. Layout: 8-byte magic,
// 8-byte little-endian payload length, 4-byte little-endian CRC-32 of the
// payload, then the payload (a serialised dp.v1.Checkpoint).
#ifndef DP_PROTO_CHECKPOINT_FORMAT_H_
#define DP_PROTO_CHECKPOINT_FORMAT_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dataset.h"
#include "common/job_config.h"
#include "common/model_layout.h"
#include "common/shard_plan.h"

namespace dp {

struct Checkpoint {
  JobConfig config;
  std::optional<DataFingerprint> data;
  // The tensors of `state` are this shard's range (one dp-ps: all of it).
  TrainingState state;
  int shard_index = 0;
  int shard_count = 1;
};

std::string EncodeCheckpoint(const ModelLayout& layout, const Checkpoint& c);
// DATA_LOSS for a truncated or corrupt image (bad magic, length, checksum,
// payload, tensors that do not fit the shard it names); FAILED_PRECONDITION
// when it holds another model.
absl::StatusOr<Checkpoint> DecodeCheckpoint(const ModelLayout& layout,
                                            absl::string_view bytes);

}  // namespace dp

#endif  // DP_PROTO_CHECKPOINT_FORMAT_H_
