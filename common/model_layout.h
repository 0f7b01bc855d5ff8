// The flat parameter layout of an MLP (SimpleNet by default), in PyTorch
// state_dict order: fc1.weight [out,in], fc1.bias [out], fc2.weight, ...
#ifndef DP_COMMON_MODEL_LAYOUT_H_
#define DP_COMMON_MODEL_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dp {

struct TensorInfo {
  std::string name;            // "fc1.weight"
  std::vector<int64_t> shape;  // {256, 784}
  int64_t offset = 0;          // in floats, into the flat buffer
  int64_t size = 0;            // in floats
};

class ModelLayout {
 public:
  // 784-256-128-10: 235,146 parameters.
  static ModelLayout SimpleNet();
  // dims = {inputs, hidden..., outputs}; at least two entries. Layer l maps
  // dims[l] -> dims[l+1]; ReLU after every layer but the last. `dims` must
  // pass CheckMlpDims.
  static ModelLayout Mlp(std::vector<int> dims);

  const std::vector<int>& dims() const { return dims_; }
  int num_layers() const { return static_cast<int>(dims_.size()) - 1; }
  int input_dim() const { return dims_.front(); }
  int num_classes() const { return dims_.back(); }
  int64_t num_params() const { return num_params_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Weight of layer l is (dims[l+1], dims[l]) row-major.
  const TensorInfo& weight(int layer) const { return tensors_[2 * layer]; }
  const TensorInfo& bias(int layer) const { return tensors_[2 * layer + 1]; }
  // Identifies the architecture (dims and names); workers and dp-ps must agree.
  uint64_t Fingerprint() const;

 private:
  explicit ModelLayout(std::vector<int> dims);
  std::vector<int> dims_;
  std::vector<TensorInfo> tensors_;
  int64_t num_params_ = 0;
};

// The most parameters a model may have: its float32 weights must fit one
// gRPC message (2 GiB) with room for the framing.
inline constexpr int64_t kMaxModelParams = (int64_t{1} << 29) - (1 << 16);

// INVALID_ARGUMENT, naming `what` (a flag, a file), unless `dims` describe
// an MLP: at least two widths, each at least 1, and at most kMaxModelParams
// parameters in all.
[[nodiscard]] absl::Status CheckMlpDims(const std::vector<int>& dims,
                                        absl::string_view what);

// "784,256,128,10" -> {784, 256, 128, 10}, checked by CheckMlpDims;
// INVALID_ARGUMENT naming `what` and the entry that is not a width.
absl::StatusOr<std::vector<int>> ParseMlpDims(absl::string_view text,
                                              absl::string_view what);

// {784, 256, 128, 10} -> "784,256,128,10".
std::string MlpDimsString(const std::vector<int>& dims);

// PyTorch's default nn.Linear initialisation: every weight and bias of layer l
// ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), drawn deterministically from `seed`.
std::vector<float> InitParams(const ModelLayout& layout, uint64_t seed);

}  // namespace dp

#endif  // DP_COMMON_MODEL_LAYOUT_H_
