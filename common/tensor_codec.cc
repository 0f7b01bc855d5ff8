// float32 <-> wire encodings. Loops over raw bits so that they vectorise and
// give the same bytes on every machine.
#include "common/tensor_codec.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dp {

absl::StatusOr<Encoding> ParseEncoding(absl::string_view name) {
  if (name == "f32") return Encoding::kF32;
  if (name == "bf16") return Encoding::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown encoding '", name, "' (valid: f32, bf16)"));
}

const char* EncodingName(Encoding e) {
  switch (e) {
    case Encoding::kF32:
      return "f32";
    case Encoding::kBf16:
      return "bf16";
  }
  return "an unknown encoding";
}

size_t BytesPerValue(Encoding e) { return e == Encoding::kBf16 ? 2 : 4; }

void Encode(Encoding e, const float* x, int64_t n, char* out) {
  if (e == Encoding::kF32) {
    std::memcpy(out, x, n * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    // Round to nearest even on the dropped 16 bits. That addition would carry
    // a NaN into the exponent or the sign (0xffff8000 becomes +0.0,
    // 0x7f800001 becomes Inf), so a NaN takes the quiet NaN of its sign
    // instead: the server must see it to refuse it. A select, not a branch,
    // so the loop still vectorises.
    const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    const uint16_t half =
        static_cast<uint16_t>(nan ? ((bits >> 16) | 0x0040u) : (rounded >> 16));
    std::memcpy(out + 2 * i, &half, 2);
  }
}

namespace {

// Decodes n encoded values into out and returns the index of the first NaN,
// Inf or value beyond `limit` in magnitude among them, or -1. The bytes may
// be memory another process can still write: they are read once, and the
// index is looked for in `out`, what was read. The branch-free OR-reduction
// vectorises; only when it fires is the position looked for.
template <Encoding E>
int64_t DecodeAndFindOutOfRange(const char* bytes, int64_t n, float limit,
                                float* out) {
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float x = DecodedValue<E>(bytes, i);
    out[i] = x;
    any |= static_cast<uint32_t>(OutOfRange(x, limit));
  }
  if (any == 0) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (OutOfRange(out[i], limit)) return i;
  }
  return -1;
}

// The same without keeping the values: each is read once, and the first
// bad one read is the answer.
template <Encoding E>
int64_t FindOutOfRange(const char* bytes, int64_t n, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    if (OutOfRange(DecodedValue<E>(bytes, i), limit)) return i;
  }
  return -1;
}

}  // namespace

void Decode(Encoding e, const char* bytes, int64_t n, float* out) {
  if (e == Encoding::kF32) {
    std::memcpy(out, bytes, n * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    out[i] = DecodedValue<Encoding::kBf16>(bytes, i);
}

int64_t FirstOutOfRange(Encoding e, const char* bytes, int64_t n, float limit) {
  return e == Encoding::kBf16 ? FindOutOfRange<Encoding::kBf16>(bytes, n, limit)
                              : FindOutOfRange<Encoding::kF32>(bytes, n, limit);
}

int64_t DecodeChecked(Encoding e, const char* bytes, int64_t n, float limit,
                      float* out) {
  return e == Encoding::kBf16
             ? DecodeAndFindOutOfRange<Encoding::kBf16>(bytes, n, limit, out)
             : DecodeAndFindOutOfRange<Encoding::kF32>(bytes, n, limit, out);
}

}  // namespace dp
