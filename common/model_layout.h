// The flat parameter layout of a model: its named float32 tensors, one
// after another in one vector. An MLP's (SimpleNet by default) lie in
// PyTorch state_dict order: fc1.weight [out,in], fc1.bias [out], fc2.weight,
// ...; any other model's in the order it names them (FromTensors).
#ifndef DP_COMMON_MODEL_LAYOUT_H_
#define DP_COMMON_MODEL_LAYOUT_H_

#include <cstdint>
#include <optional>
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
  bool operator==(const TensorInfo& o) const {
    return name == o.name && shape == o.shape && offset == o.offset &&
           size == o.size;
  }
};

struct JobConfig;

class ModelLayout {
 public:
  // 784-256-128-10: 235,146 parameters.
  static ModelLayout SimpleNet();
  // dims = {inputs, hidden..., outputs}; at least two entries. Layer l maps
  // dims[l] -> dims[l+1]; ReLU after every layer but the last. `dims` must
  // pass CheckMlpDims.
  static ModelLayout Mlp(std::vector<int> dims);
  // Any model: `tensors`' names and shapes (their offset and size are
  // computed), laid out in the order given. Tensors that are an MLP's in
  // its order make that MLP. INVALID_ARGUMENT naming the tensor unless every
  // name is non-empty and unique and every dimension at least 1 (a shape of
  // none is a scalar), and there are some, at most kMaxModelParams in all.
  static absl::StatusOr<ModelLayout> FromTensors(
      std::vector<TensorInfo> tensors);

  // An MLP's: dims(), weight() and bias() are only for those (and the
  // process stops when asked of another model).
  bool is_mlp() const { return !dims_.empty(); }
  const std::vector<int>& dims() const;
  int num_layers() const { return static_cast<int>(dims().size()) - 1; }
  int input_dim() const { return dims().front(); }
  int num_classes() const { return dims().back(); }
  int64_t num_params() const { return num_params_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Weight of layer l is (dims[l+1], dims[l]) row-major.
  const TensorInfo& weight(int layer) const;
  const TensorInfo& bias(int layer) const;
  // Identifies the architecture: FNV-1a over the tensors' names and shapes
  // in order; workers and dp-ps must agree.
  uint64_t Fingerprint() const;
  // "MLP 784,256,128,10, 235146 parameters" or "5 tensors (conv1.weight
  // [4,1,3,3], ...), 4268 parameters": for logs.
  std::string Describe() const;

 private:
  explicit ModelLayout(std::vector<int> dims);
  ModelLayout() = default;
  std::vector<int> dims_;  // empty: not an MLP
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

// The widths of the MLP whose tensors `tensors` are, in any order (names
// fc1.weight, fc1.bias, ... with chained shapes, nothing else); nullopt
// when they are not an MLP's.
std::optional<std::vector<int>> MlpDimsOfTensors(
    const std::vector<TensorInfo>& tensors);

// A job's model (its layers, or its tensors when it is not an MLP);
// INVALID_ARGUMENT, naming `what`, when they make none.
absl::StatusOr<ModelLayout> LayoutOfJob(const JobConfig& job,
                                        absl::string_view what);

// {784, 256, 128, 10} -> "784,256,128,10".
std::string MlpDimsString(const std::vector<int>& dims);

// PyTorch's default nn.Linear initialisation: every weight and bias of layer l
// ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), drawn deterministically from `seed`.
// Only for an MLP: another model starts from a file (dp-ps --init_model).
std::vector<float> InitParams(const ModelLayout& layout, uint64_t seed);

}  // namespace dp

#endif  // DP_COMMON_MODEL_LAYOUT_H_
