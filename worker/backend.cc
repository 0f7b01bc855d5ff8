// The default ViewWeights (a copy), and the input checks shared by every
// backend (the CPU one here, the CUDA one in its module), so that all refuse
// the same inputs with the same messages.
#include "worker/backend.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_config.h"
#include "common/status_macros.h"

namespace dp {

absl::StatusOr<ModelLayout> JobMlp(const JobConfig& job) {
  if (!job.tensors.empty()) {
    absl::StatusOr<ModelLayout> layout = LayoutOfJob(job, "the job's model");
    return absl::FailedPreconditionError(absl::StrCat(
        "the job's model is not an MLP (",
        layout.ok() ? layout->Describe() : layout.status().message(),
        "): dp-worker computes MLPs only; train this job with the Python "
        "worker, the dp_ps package (docs/python.md)"));
  }
  RETURN_IF_ERROR(CheckMlpDims(job.layers, "the job's layers (dp-ps)"));
  return ModelLayout::Mlp(job.layers);
}

absl::Status Backend::ViewWeights(
    absl::Span<const absl::Span<const float>> tensors) {
  size_t total = 0;
  bool one_piece = true;
  for (size_t i = 0; i < tensors.size(); ++i) {
    one_piece = one_piece &&
                (i == 0 || tensors[i].data() ==
                               tensors[i - 1].data() + tensors[i - 1].size());
    total += tensors[i].size();
  }
  if (one_piece && !tensors.empty()) {
    return SetWeights(absl::MakeConstSpan(tensors[0].data(), total));
  }
  // Reused from call to call: a worker views new weights every step.
  thread_local std::vector<float> flat;
  flat.clear();
  for (absl::Span<const float> t : tensors) {
    flat.insert(flat.end(), t.begin(), t.end());
  }
  return SetWeights(flat);
}

absl::Status CheckTensorViews(
    const ModelLayout& layout,
    absl::Span<const absl::Span<const float>> tensors) {
  const std::vector<TensorInfo>& want = layout.tensors();
  if (tensors.size() != want.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ViewWeights: ", tensors.size(), " tensors, the model has ",
        want.size(), " (", want.front().name, " to ", want.back().name, ")"));
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (static_cast<int64_t>(tensors[i].size()) != want[i].size) {
      return absl::InvalidArgumentError(
          absl::StrCat("ViewWeights: ", want[i].name, " has ",
                       tensors[i].size(), " floats, expected ", want[i].size));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBackendInputs(const char* what, const ModelLayout& layout,
                                bool weights_set, int max_batch,
                                absl::Span<const float> x,
                                absl::Span<const int32_t> labels) {
  if (!weights_set) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": SetWeights has not been called"));
  }
  const int64_t n = static_cast<int64_t>(labels.size());
  if (max_batch > 0 && (n == 0 || n > max_batch)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": batch of ", n,
                                                   " labels, expected 1..",
                                                   max_batch, " (max_batch)"));
  }
  const int64_t want_x = n * layout.input_dim();
  if (static_cast<int64_t>(x.size()) != want_x) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": x has ", x.size(), " floats, expected ", n,
        " samples * input_dim ", layout.input_dim(), " = ", want_x));
  }
  const int C = layout.num_classes();
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] < 0 || labels[i] >= C) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", labels[i], " of sample ", i, " is outside [0, ", C, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace dp
