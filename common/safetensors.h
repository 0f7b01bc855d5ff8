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

// The widths of the MLP whose tensors a safetensors file image holds, read
// from the shapes of fc1.weight, fc2.weight, ... ([out, in] each, every
// layer's inputs the previous one's outputs): {in, out1, out2, ...}.
// DATA_LOSS for a malformed header; INVALID_ARGUMENT when there is no
// fc1.weight or the shapes do not chain. The other tensors (the biases,
// anything unexpected) are DecodeSafetensors' to check.
absl::StatusOr<std::vector<int>> MlpDimsOfSafetensors(absl::string_view bytes);
// ReadFile + MlpDimsOfSafetensors; errors name the path.
absl::StatusOr<std::vector<int>> LoadMlpDims(const std::string& path);

// EncodeSafetensors + WriteFileAtomic.
[[nodiscard]] absl::Status SaveSafetensors(const std::string& path,
                                           const ModelLayout& layout,
                                           absl::Span<const float> params);
// ReadFile + DecodeSafetensors; errors name the path.
absl::StatusOr<std::vector<float>> LoadSafetensors(const std::string& path,
                                                   const ModelLayout& layout);

}  // namespace dp

#endif  // DP_COMMON_SAFETENSORS_H_
