// A model out of checkpoint files, without starting a job: one dp-ps's
// checkpoint holds the whole vector, a sharded job's one file per shard
// (each its range). `dp-ps --export_checkpoint=FILE[,FILE...]
// --save_model=OUT` writes it as safetensors that PyTorch loads with
// load_state_dict.
#ifndef DP_SERVER_MODEL_EXPORT_H_
#define DP_SERVER_MODEL_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_layout.h"

namespace dp {

struct ExportedModel {
  int64_t step = 0;  // the weights' version
  std::vector<float> params;
};

// The weights in `files`: one dp-ps's checkpoint, or one file of each shard
// of a job (in any order), all of one step. Errors name the file and what is
// wrong: unreadable, corrupt, another model (FAILED_PRECONDITION), a shard
// missing or given twice, files of different steps or jobs
// (INVALID_ARGUMENT).
absl::StatusOr<ExportedModel> ModelFromCheckpoints(
    const ModelLayout& layout, const std::vector<std::string>& files);

}  // namespace dp

#endif  // DP_SERVER_MODEL_EXPORT_H_
