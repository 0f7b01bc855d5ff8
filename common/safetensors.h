// Model files in the safetensors format: 8-byte little-endian header length,
// a JSON header {"fc1.weight":{"dtype":"F32","shape":[256,784],
// "data_offsets":[b,e]},...}, then the raw little-endian tensor data.
// Loadable by torch.nn.Module.load_state_dict(safetensors.torch.load_file(p)).
#ifndef DP_COMMON_SAFETENSORS_H_
#define DP_COMMON_SAFETENSORS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/model_layout.h"

namespace dp {

// Serialises `params` (layout.num_params() floats) with one tensor per entry
// of layout.tensors(), in layout order, plus string `metadata`
// ("__metadata__"). Deterministic: the same inputs give the same bytes.
std::string EncodeSafetensors(
    const ModelLayout& layout, absl::Span<const float> params,
    const std::map<std::string, std::string>& metadata = {});

// Parses a safetensors file image and returns the flat parameter buffer.
// DATA_LOSS for a truncated or malformed file; INVALID_ARGUMENT naming the
// tensor when a name, dtype or shape does not match `layout`.
absl::StatusOr<std::vector<float>> DecodeSafetensors(const ModelLayout& layout,
                                                     absl::string_view bytes);

// The model whose tensors a safetensors file image holds: the MLP when
// they are an MLP's (fc1.weight [out,in], fc1.bias [out], fc2.weight, ...,
// shapes chained, in any order in the file), else exactly the file's
// tensors in the order of their data offsets (dp-ps's writer keeps the
// model's order; safetensors.torch.save_file's is by name). DATA_LOSS for a malformed
// header; INVALID_ARGUMENT naming the tensor for a dtype other than F32 or
// a shape no model has (ModelLayout::FromTensors), and for no tensors. The
// data (its ranges, its values) is DecodeSafetensors' to check.
absl::StatusOr<ModelLayout> SafetensorsModel(absl::string_view bytes);
// ReadFile + SafetensorsModel; errors name the path.
absl::StatusOr<ModelLayout> LoadSafetensorsModel(const std::string& path);

// EncodeSafetensors + WriteFileAtomic.
[[nodiscard]] absl::Status SaveSafetensors(const std::string& path,
                                           const ModelLayout& layout,
                                           absl::Span<const float> params);
// ReadFile + DecodeSafetensors; errors name the path.
absl::StatusOr<std::vector<float>> LoadSafetensors(const std::string& path,
                                                   const ModelLayout& layout);

}  // namespace dp

#endif  // DP_COMMON_SAFETENSORS_H_
