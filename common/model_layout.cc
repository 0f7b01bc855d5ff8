// MLP parameter layout and PyTorch-default initialisation.
#include "common/model_layout.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "common/status_macros.h"

namespace dp {

ModelLayout ModelLayout::SimpleNet() { return ModelLayout({784, 256, 128, 10}); }

ModelLayout ModelLayout::Mlp(std::vector<int> dims) {
  return ModelLayout(std::move(dims));
}

ModelLayout::ModelLayout(std::vector<int> dims) : dims_(std::move(dims)) {
  DP_CHECK(dims_.size() >= 2);
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

std::vector<float> InitParams(const ModelLayout& layout, uint64_t seed) {
  std::vector<float> params(layout.num_params());
  for (int l = 0; l < layout.num_layers(); ++l) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(layout.dims()[l]));
    for (const TensorInfo* t : {&layout.weight(l), &layout.bias(l)}) {
      // One stream per tensor: changing one tensor's size leaves the others' values.
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
