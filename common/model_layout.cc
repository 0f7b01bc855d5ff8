// MLP parameter layout and PyTorch-default initialisation.
#include "common/model_layout.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
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
