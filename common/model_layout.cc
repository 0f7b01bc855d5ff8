// Model parameter layouts (an MLP's or any named tensors') and the
// PyTorch-default initialisation of an MLP.
#include "common/model_layout.h"

#include <cmath>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/job_config.h"
#include "common/random.h"
#include "common/status_macros.h"

namespace dp {

ModelLayout ModelLayout::SimpleNet() {
  return ModelLayout({784, 256, 128, 10});
}

ModelLayout ModelLayout::Mlp(std::vector<int> dims) {
  return ModelLayout(std::move(dims));
}

ModelLayout::ModelLayout(std::vector<int> dims) : dims_(std::move(dims)) {
  DP_CHECK(CheckMlpDims(dims_, "the model").ok());
  for (int l = 0; l + 1 < static_cast<int>(dims_.size()); ++l) {
    const int64_t in = dims_[l], out = dims_[l + 1];
    const std::string prefix = absl::StrCat("fc", l + 1);
    tensors_.push_back({prefix + ".weight", {out, in}, num_params_, out * in});
    num_params_ += out * in;
    tensors_.push_back({prefix + ".bias", {out}, num_params_, out});
    num_params_ += out;
  }
}

absl::StatusOr<ModelLayout> ModelLayout::FromTensors(
    std::vector<TensorInfo> tensors) {
  if (tensors.empty()) {
    return absl::InvalidArgumentError("a model needs a tensor, got none");
  }
  ModelLayout layout;
  std::set<std::string> names;
  for (TensorInfo& t : tensors) {
    const auto invalid = [&t](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", t.name, "\" [", absl::StrJoin(t.shape, ","), "]: ", why));
    };
    if (t.name.empty()) return invalid("a tensor needs a name");
    if (!names.insert(t.name).second) return invalid("named twice");
    int64_t size = 1;
    for (int64_t d : t.shape) {
      if (d < 1) return invalid("every dimension must be at least 1");
      // Checked before the product, which could overflow.
      if (size > kMaxModelParams / d) size = kMaxModelParams;
      size *= d;
    }
    if (size > kMaxModelParams - layout.num_params_) {
      return invalid(absl::StrFormat(
          "the model has more than %d parameters, the most one gRPC message "
          "carries",
          kMaxModelParams));
    }
    t.offset = layout.num_params_;
    t.size = size;
    layout.num_params_ += size;
  }
  layout.tensors_ = std::move(tensors);
  // An MLP's tensors in its order are that MLP, whoever names them.
  if (std::optional<std::vector<int>> dims = MlpDimsOfTensors(layout.tensors_);
      dims.has_value() && Mlp(*dims).tensors() == layout.tensors_) {
    return Mlp(*std::move(dims));
  }
  return layout;
}

const std::vector<int>& ModelLayout::dims() const {
  // Reaching here with another model is a bug: its callers compute MLPs and
  // refuse other models first.
  DP_CHECK(is_mlp());
  return dims_;
}

const TensorInfo& ModelLayout::weight(int layer) const {
  DP_CHECK(is_mlp());
  return tensors_[2 * layer];
}

const TensorInfo& ModelLayout::bias(int layer) const {
  DP_CHECK(is_mlp());
  return tensors_[2 * layer + 1];
}

std::string ModelLayout::Describe() const {
  if (is_mlp()) {
    return absl::StrFormat("MLP %s, %d parameters", MlpDimsString(dims_),
                           num_params_);
  }
  constexpr size_t kNamed = 3;
  std::vector<std::string> named;
  for (size_t i = 0; i < tensors_.size() && i < kNamed; ++i) {
    named.push_back(absl::StrCat(tensors_[i].name, " [",
                                 absl::StrJoin(tensors_[i].shape, ","), "]"));
  }
  if (tensors_.size() > kNamed) named.push_back("...");
  return absl::StrFormat("%d tensors (%s), %d parameters", tensors_.size(),
                         absl::StrJoin(named, ", "), num_params_);
}

uint64_t ModelLayout::Fingerprint() const {
  // FNV-1a over the tensor names and shapes.
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  };
  for (const TensorInfo& t : tensors_) {
    for (char c : t.name) mix(static_cast<unsigned char>(c));
    for (int64_t d : t.shape) mix(static_cast<uint64_t>(d));
  }
  return h;
}

absl::Status CheckMlpDims(const std::vector<int>& dims,
                          absl::string_view what) {
  if (dims.size() < 2) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: an MLP needs at least two widths (inputs and outputs), got %d",
        what, dims.size()));
  }
  for (size_t l = 0; l < dims.size(); ++l) {
    if (dims[l] < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: width %d (entry %d of %s) must be at least 1",
                          what, dims[l], l + 1, MlpDimsString(dims)));
    }
  }
  int64_t params = 0;
  for (size_t l = 0; l + 1 < dims.size(); ++l) {
    params += (int64_t{dims[l]} + 1) * dims[l + 1];
    if (params > kMaxModelParams) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the MLP %s has more than %d parameters, the most one gRPC "
          "message carries",
          what, MlpDimsString(dims), kMaxModelParams));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> ParseMlpDims(absl::string_view text,
                                              absl::string_view what) {
  std::vector<int> dims;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    int width = 0;
    if (!absl::SimpleAtoi(entry, &width)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: \"%s\" is not a width (comma-separated integers, inputs "
          "first, e.g. 784,256,128,10)",
          what, entry));
    }
    dims.push_back(width);
  }
  RETURN_IF_ERROR(CheckMlpDims(dims, what));
  return dims;
}

std::optional<std::vector<int>> MlpDimsOfTensors(
    const std::vector<TensorInfo>& tensors) {
  std::map<std::string, const std::vector<int64_t>*> shapes;
  for (const TensorInfo& t : tensors) shapes[t.name] = &t.shape;
  const auto shape_of = [&shapes](int layer, absl::string_view kind) {
    const auto it = shapes.find(absl::StrCat("fc", layer, ".", kind));
    return it == shapes.end() ? nullptr : it->second;
  };
  std::vector<int> dims;
  for (int l = 1; const std::vector<int64_t>* w = shape_of(l, "weight"); ++l) {
    const std::vector<int64_t>* b = shape_of(l, "bias");
    if (w->size() != 2 || b == nullptr || *b != std::vector<int64_t>{(*w)[0]} ||
        (*w)[0] > INT32_MAX || (*w)[1] > INT32_MAX) {
      return std::nullopt;
    }
    if (l == 1) dims.push_back(static_cast<int>((*w)[1]));
    if ((*w)[1] != dims.back()) return std::nullopt;
    dims.push_back(static_cast<int>((*w)[0]));
  }
  // Two tensors a layer and none besides (names are unique once 2L of them
  // were found among as many).
  if (dims.empty() || tensors.size() != 2 * (dims.size() - 1) ||
      !CheckMlpDims(dims, "").ok()) {
    return std::nullopt;
  }
  return dims;
}

absl::StatusOr<ModelLayout> LayoutOfJob(const JobConfig& job,
                                        absl::string_view what) {
  if (job.tensors.empty()) {
    RETURN_IF_ERROR(CheckMlpDims(job.layers, what));
    return ModelLayout::Mlp(job.layers);
  }
  absl::StatusOr<ModelLayout> layout = ModelLayout::FromTensors(job.tensors);
  if (!layout.ok()) {
    return absl::Status(layout.status().code(),
                        absl::StrCat(what, ": ", layout.status().message()));
  }
  return layout;
}

std::string MlpDimsString(const std::vector<int>& dims) {
  return absl::StrJoin(dims, ",");
}

std::vector<float> InitParams(const ModelLayout& layout, uint64_t seed) {
  std::vector<float> params(layout.num_params());
  for (int l = 0; l < layout.num_layers(); ++l) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(layout.dims()[l]));
    for (const TensorInfo* t : {&layout.weight(l), &layout.bias(l)}) {
      // One stream per tensor: changing one tensor's size leaves the others'
      // values.
      Rng rng(seed, static_cast<uint64_t>(t->offset));
      for (int64_t i = 0; i < t->size; ++i) {
        params[t->offset + i] =
            static_cast<float>((2.0 * rng.Uniform() - 1.0) * bound);
      }
    }
  }
  return params;
}

}  // namespace dp
