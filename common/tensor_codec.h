// Wire encodings of float32 tensors: raw little-endian float32, or bfloat16
// (the upper 16 bits of a float32, rounded to nearest even) for gradients,
// halving the bytes pushed per step.
#ifndef DP_COMMON_TENSOR_CODEC_H_
#define DP_COMMON_TENSOR_CODEC_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dp {

enum class Encoding { kF32 = 0, kBf16 = 1 };

// "f32" | "bf16"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Encoding> ParseEncoding(absl::string_view name);
const char* EncodingName(Encoding e);
size_t BytesPerValue(Encoding e);

// out has n * BytesPerValue(e) bytes.
void Encode(Encoding e, const float* x, int64_t n, char* out);
// bytes has n * BytesPerValue(e) bytes.
void Decode(Encoding e, const char* bytes, int64_t n, float* out);

// Index of the first of the n encoded values that is NaN, Inf or larger in
// magnitude than `limit`, or -1. Reads each value once.
int64_t FirstOutOfRange(Encoding e, const char* bytes, int64_t n,
                        float limit = std::numeric_limits<float>::max());
// Decode and FirstOutOfRange in one pass over the bytes: decodes all n
// values into out and returns the index of the first out-of-range one in
// out, or -1. The bytes are read once: the verdict holds for what is in
// out even when another process rewrites the bytes meanwhile.
int64_t DecodeChecked(Encoding e, const char* bytes, int64_t n, float limit,
                      float* out);

// Value i of the encoded bytes, and the check every received value passes:
// for loops that decode as they do something else with the values
// (server/adam.h), inline so that they vectorise there.
template <Encoding E>
inline float DecodedValue(const char* bytes, int64_t i) {
  float x;
  if constexpr (E == Encoding::kF32) {
    std::memcpy(&x, bytes + 4 * i, 4);
  } else {
    uint16_t half;
    std::memcpy(&half, bytes + 2 * i, 2);
    const uint32_t bits = static_cast<uint32_t>(half) << 16;
    std::memcpy(&x, &bits, 4);
  }
  return x;
}
// NaN, Inf or larger in magnitude than `limit` (!(|x| <= limit) is true for
// NaN).
inline bool OutOfRange(float x, float limit) {
  return !(std::fabs(x) <= limit);
}

}  // namespace dp

#endif  // DP_COMMON_TENSOR_CODEC_H_
