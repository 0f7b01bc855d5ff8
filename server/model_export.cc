#include "server/model_export.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/shard_plan.h"
#include "common/status_macros.h"
#include "proto/checkpoint_format.h"

namespace dp {
namespace {

absl::Status Naming(const std::string& file, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(file, ": ", s.message()));
}

}  // namespace

absl::StatusOr<ExportedModel> ModelFromCheckpoints(
    const ModelLayout& layout, const std::vector<std::string>& files) {
  if (files.empty()) {
    return absl::InvalidArgumentError("no checkpoint file given");
  }
  ExportedModel model;
  model.params.assign(layout.num_params(), 0.0f);
  std::optional<Checkpoint> first;
  std::vector<bool> seen;
  for (const std::string& file : files) {
    absl::StatusOr<std::string> bytes = ReadFile(file);
    if (!bytes.ok()) return Naming(file, bytes.status());
    absl::StatusOr<Checkpoint> c = DecodeCheckpoint(layout, *bytes);
    if (!c.ok()) return Naming(file, c.status());
    if (!first.has_value()) {
      first = *c;
      seen.assign(c->shard_count, false);
    } else if (c->shard_count != first->shard_count ||
               c->state.step != first->state.step ||
               !(c->config == first->config)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: shard %d of %d at step %d is not of the job of %s (shard %d "
          "of %d at step %d)",
          file, c->shard_index, c->shard_count, c->state.step, files[0],
          first->shard_index, first->shard_count, first->state.step));
    }
    if (seen[c->shard_index]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: shard %d of %d is given twice", file,
                          c->shard_index, c->shard_count));
    }
    seen[c->shard_index] = true;
    ShardSpec spec;
    RETURN_IF_ERROR(
        MakeShardSpec(layout, c->shard_count, c->shard_index, &spec));
    std::copy(c->state.params.begin(), c->state.params.end(),
              model.params.begin() + spec.range.offset);
  }
  for (size_t k = 0; k < seen.size(); ++k) {
    if (!seen[k]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the checkpoint of shard %d of %d is missing: give one file of "
          "each shard, of one step",
          k, seen.size()));
    }
  }
  model.step = first->state.step;
  return model;
}

}  // namespace dp
