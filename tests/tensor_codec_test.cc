// Wire encodings: exact where the value fits, round-to-nearest-even where it
// does not, and non-finite values found at their index.
#include "common/tensor_codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dp {
namespace {

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

float RoundTrip(float x) {
  char buf[2];
  Encode(Encoding::kBf16, &x, 1, buf);
  float y;
  Decode(Encoding::kBf16, buf, 1, &y);
  return y;
}

TEST(TensorCodecTest, Bf16KeepsValuesWithEightSignificantBitsExactly) {
  for (float x : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 3.0e38f, 1e-30f, 255.0f}) {
    const float y = RoundTrip(x);
    if (x == 3.0e38f || x == 1e-30f) {
      EXPECT_NEAR(y, x, std::fabs(x) / 128) << x;
    } else {
      EXPECT_EQ(y, x) << x;
    }
  }
}

TEST(TensorCodecTest, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even 1.
  EXPECT_EQ(RoundTrip(FromBits(0x3f808000u)), 1.0f);
  // 1 + 3*2^-8 lies halfway between 1+2^-7 and 1+2^-6: ties go up to even.
  EXPECT_EQ(RoundTrip(FromBits(0x3f818000u)), FromBits(0x3f820000u));
  // Just above halfway rounds up.
  EXPECT_EQ(RoundTrip(FromBits(0x3f808001u)), FromBits(0x3f810000u));
  // Half an ulp of an 8-significant-bit format: relative error <= 2^-8.
  for (float x = -100.0f; x < 100.0f; x += 0.37f) {
    EXPECT_LE(std::fabs(RoundTrip(x) - x), std::fabs(x) * (1.0f / 256)) << x;
  }
}

// A diverged worker's NaN gradient must reach the server as NaN, where
// validation refuses it, never as a finite number. Every float NaN (sign,
// quiet or signalling, any payload) is checked: 2^24 patterns, in one call.
TEST(TensorCodecTest, Bf16KeepsEveryNanAQuietNanOfTheSameSign) {
  std::vector<float> nans;
  nans.reserve(2 << 23);
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t mantissa = 1; mantissa < (1u << 23); ++mantissa) {
      nans.push_back(FromBits(sign | 0x7f800000u | mantissa));
    }
  }
  std::vector<char> bytes(nans.size() * 2);
  Encode(Encoding::kBf16, nans.data(), nans.size(), bytes.data());
  int64_t wrong = 0;
  uint32_t first_wrong = 0;
  for (size_t i = 0; i < nans.size(); ++i) {
    uint16_t half;
    std::memcpy(&half, bytes.data() + 2 * i, 2);
    uint32_t in;
    std::memcpy(&in, &nans[i], 4);
    // Quiet NaN: exponent all ones, top mantissa bit set; the sign kept.
    if ((half & 0x7fc0u) != 0x7fc0u || (half >> 15) != (in >> 31)) {
      if (wrong++ == 0) first_wrong = in;
    }
  }
  EXPECT_EQ(wrong, 0) << "NaNs encoded as something else, the first 0x"
                      << std::hex << first_wrong;
  EXPECT_EQ(FirstOutOfRange(Encoding::kBf16, bytes.data(), nans.size()), 0);
}

TEST(TensorCodecTest, Bf16KeepsInfinitiesAndRoundsHugeValuesToInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(RoundTrip(inf), inf);
  EXPECT_EQ(RoundTrip(-inf), -inf);
  // The largest float lies above the largest bf16's halfway point.
  EXPECT_EQ(RoundTrip(std::numeric_limits<float>::max()), inf);
  EXPECT_EQ(RoundTrip(-std::numeric_limits<float>::max()), -inf);
  // 0x7f7f7fff is below it: rounds down to the largest bf16, 0x7f7f.
  EXPECT_EQ(RoundTrip(FromBits(0x7f7f7fffu)), FromBits(0x7f7f0000u));
}

// The server's check of a bf16 gradient sees every NaN, whatever its bits.
TEST(TensorCodecTest, Bf16NanGradientIsRefusedByDecodeChecked) {
  for (uint32_t bits : {0x7fc00000u, 0x7fffffffu, 0x7f800001u, 0xffffffffu,
                        0xffff8000u, 0xffc00000u, 0xff800001u}) {
    const std::vector<float> g = {1.0f, FromBits(bits), 2.0f};
    std::vector<char> bytes(g.size() * 2);
    Encode(Encoding::kBf16, g.data(), g.size(), bytes.data());
    std::vector<float> out(g.size());
    EXPECT_EQ(DecodeChecked(Encoding::kBf16, bytes.data(), g.size(), 1e15f,
                            out.data()),
              1)
        << std::hex << bits;
    EXPECT_TRUE(std::isnan(out[1])) << std::hex << bits;
  }
}

TEST(TensorCodecTest, F32IsBitExact) {
  const std::vector<float> x = {1.5f, -3.25e-12f, 7e30f};
  std::vector<char> bytes(x.size() * 4);
  Encode(Encoding::kF32, x.data(), x.size(), bytes.data());
  std::vector<float> y(x.size());
  Decode(Encoding::kF32, bytes.data(), x.size(), y.data());
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * 4));
}

TEST(TensorCodecTest, FirstNonFiniteFindsNanAndInfInBothEncodings) {
  for (Encoding e : {Encoding::kF32, Encoding::kBf16}) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> x(1000, 0.5f);
      x[777] = bad;
      x[900] = bad;
      std::vector<char> bytes(x.size() * BytesPerValue(e));
      Encode(e, x.data(), x.size(), bytes.data());
      EXPECT_EQ(FirstOutOfRange(e, bytes.data(), x.size()), 777)
          << EncodingName(e) << " " << bad;
    }
    std::vector<float> fine(1000, std::numeric_limits<float>::max() / 2);
    std::vector<char> bytes(fine.size() * BytesPerValue(e));
    Encode(e, fine.data(), fine.size(), bytes.data());
    EXPECT_EQ(FirstOutOfRange(e, bytes.data(), fine.size()), -1);
    EXPECT_EQ(FirstOutOfRange(e, bytes.data(), fine.size(), 1e30f), 0);
  }
}

TEST(TensorCodecTest, ParseEncodingNamesTheValidChoices) {
  EXPECT_EQ(*ParseEncoding("bf16"), Encoding::kBf16);
  EXPECT_EQ(*ParseEncoding("f32"), Encoding::kF32);
  auto bad = ParseEncoding("fp8");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("f32, bf16"), std::string::npos);
}

TEST(TensorCodecTest, DecodeCheckedIsDecodePlusFirstOutOfRange) {
  const float kLimit = 1e15f;
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), 3e15f};
  for (Encoding e : {Encoding::kF32, Encoding::kBf16}) {
    for (int64_t n : {1, 7, 1000}) {
      for (int64_t at : {int64_t{-1}, int64_t{0}, n / 2, n - 1}) {
        for (float bad : bad_values) {
          std::vector<float> x(n);
          for (int64_t i = 0; i < n; ++i) x[i] = 0.001f * i - 0.3f;
          if (at >= 0) x[at] = bad;
          std::string bytes(n * BytesPerValue(e), '\0');
          Encode(e, x.data(), n, bytes.data());
          std::vector<float> decoded(n), checked(n);
          Decode(e, bytes.data(), n, decoded.data());
          const int64_t first = FirstOutOfRange(e, bytes.data(), n, kLimit);
          EXPECT_EQ(DecodeChecked(e, bytes.data(), n, kLimit, checked.data()),
                    first);
          EXPECT_EQ(first, at);
          EXPECT_EQ(std::memcmp(decoded.data(), checked.data(), n * 4), 0);
          if (at < 0) break;  // one clean case per size is enough
        }
      }
    }
  }
}

}  // namespace
}  // namespace dp
