// Specification of the safetensors codec and of the atomic file writer.
#include "common/safetensors.h"

#include <algorithm>

#include <signal.h>
#include <stdlib.h>
#include <sys/fsuid.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/file_util.h"
#include "common/model_layout.h"
#include "gtest/gtest.h"
#include "tests/same_state.h"

namespace dp {
namespace {

namespace fs = std::filesystem;

// The exact header EncodeSafetensors writes for Mlp({3,4,2}): 257 bytes of
// JSON plus 7 spaces, so that the data starts at byte 8 + 264 = 272.
constexpr char kSmallJson[] =
    R"({"fc1.weight":{"dtype":"F32","shape":[4,3],"data_offsets":[0,48]},)"
    R"("fc1.bias":{"dtype":"F32","shape":[4],"data_offsets":[48,64]},)"
    R"("fc2.weight":{"dtype":"F32","shape":[2,4],"data_offsets":[64,96]},)"
    R"("fc2.bias":{"dtype":"F32","shape":[2],"data_offsets":[96,104]}})";
constexpr uint64_t kSmallHeaderLen = 264;
constexpr size_t kSmallDataBytes = 26 * sizeof(float);

ModelLayout Small() { return ModelLayout::Mlp({3, 4, 2}); }

// 26 floats including values that a lossy path would change: -0, a NaN with
// a payload, infinities, a denormal, the extremes.
std::vector<float> SmallParams() {
  std::vector<float> p(26);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(i) - 12.5f;
  const uint32_t nan_bits = 0x7fc12345u;
  std::memcpy(&p[0], &nan_bits, sizeof(float));
  p[1] = -0.0f;
  p[2] = std::numeric_limits<float>::infinity();
  p[3] = -std::numeric_limits<float>::infinity();
  p[4] = std::numeric_limits<float>::denorm_min();
  p[5] = std::numeric_limits<float>::max();
  p[6] = std::numeric_limits<float>::lowest();
  return p;
}

// Whether `text` contains `sub`, printing both when it does not.
::testing::AssertionResult Contains(absl::string_view text,
                                    absl::string_view sub) {
  if (text.find(sub) != absl::string_view::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "\"" << text << "\" does not contain \"" << sub << "\"";
}

std::string Le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}

// A file image with the given header text and `data_bytes` bytes of data.
std::string MakeFile(const std::string& json, size_t data_bytes) {
  return Le64(json.size()) + json + std::string(data_bytes, '\0');
}

absl::Status DecodeSmall(const std::string& json,
                         size_t data_bytes = kSmallDataBytes) {
  return DecodeSafetensors(Small(), MakeFile(json, data_bytes)).status();
}

std::string Replace(std::string s, const std::string& from,
                    const std::string& to) {
  const size_t pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from << " not in " << s;
  if (pos != std::string::npos) s.replace(pos, from.size(), to);
  return s;
}

// --- Encoding ---------------------------------------------------------------

TEST(SafetensorsEncode, HeaderIsExactJsonPaddedToEightByteAlignment) {
  const std::string bytes = EncodeSafetensors(Small(), SmallParams());
  ASSERT_EQ(bytes.size(), 8 + kSmallHeaderLen + kSmallDataBytes);
  EXPECT_EQ(bytes.substr(0, 8), Le64(kSmallHeaderLen));
  EXPECT_EQ(bytes.substr(8, kSmallHeaderLen),
            std::string(kSmallJson) + std::string(7, ' '));
  EXPECT_EQ((8 + kSmallHeaderLen) % 8, 0u);
}

TEST(SafetensorsEncode, DataIsTheFlatBufferInLayoutOrder) {
  const std::vector<float> p = SmallParams();
  const std::string bytes = EncodeSafetensors(Small(), p);
  ASSERT_EQ(bytes.size(), 8 + kSmallHeaderLen + kSmallDataBytes);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + kSmallHeaderLen, p.data(),
                        kSmallDataBytes),
            0);
}

TEST(SafetensorsEncode, SameInputsGiveSameBytes) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> p = InitParams(layout, 7);
  const std::map<std::string, std::string> meta = {{"step", "12"},
                                                   {"format", "pt"}};
  EXPECT_EQ(EncodeSafetensors(layout, p, meta),
            EncodeSafetensors(layout, p, meta));
  EXPECT_EQ(EncodeSafetensors(layout, p), EncodeSafetensors(layout, p));
}

TEST(SafetensorsEncode, DataStartIsEightByteAlignedForAnyMetadataLength) {
  const ModelLayout layout = Small();
  for (size_t len = 0; len < 16; ++len) {
    const std::string bytes = EncodeSafetensors(layout, SmallParams(),
                                                {{"k", std::string(len, 'x')}});
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ((8 + n) % 8, 0u) << "metadata value length " << len;
    EXPECT_EQ(bytes.size(), 8 + n + kSmallDataBytes);
  }
}

TEST(SafetensorsEncode, MetadataComesFirstAndIsEscaped) {
  const std::string bytes = EncodeSafetensors(
      Small(), SmallParams(), {{"format", "pt"}, {"note", "a\"b\\c\nd"}});
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(
      header.rfind(R"({"__metadata__":{"format":"pt","note":"a\"b\\c\u000ad"},)"
                   R"("fc1.weight":)",
                   0),
      0u)
      << header;
  auto decoded = DecodeSafetensors(Small(), bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(SameBits(*decoded, SmallParams()));
}

// --- Round trips ------------------------------------------------------------

TEST(SafetensorsRoundTrip, SmallLayoutIsBitExact) {
  auto decoded =
      DecodeSafetensors(Small(), EncodeSafetensors(Small(), SmallParams()));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(SameBits(*decoded, SmallParams()));
}

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl =
        (fs::path(::testing::TempDir()) / "safetensors_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::set<std::string> Entries() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) {
      names.insert(e.path().filename().string());
    }
    return names;
  }
  static void WriteRaw(const std::string& path, const std::string& contents) {
    std::ofstream(path, std::ios::binary) << contents;
  }
  std::string dir_;
};

using SafetensorsFileTest = TempDirTest;
using WriteFileAtomicTest = TempDirTest;

TEST_F(SafetensorsFileTest, SimpleNetRoundTripsThroughAFileBitExactly) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  const std::vector<float> p = InitParams(layout, 1234);
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(SaveSafetensors(path, layout, p).ok());
  auto loaded = LoadSafetensors(path, layout);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->size(), 235146u);
  EXPECT_TRUE(SameBits(*loaded, p));
  EXPECT_EQ(Entries(), std::set<std::string>{"model.safetensors"});
}

TEST_F(SafetensorsFileTest, LoadingAMissingFileIsNotFoundNamingThePath) {
  const std::string path = Path("absent.safetensors");
  auto loaded = LoadSafetensors(path, Small());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(loaded.status().message(), path));
}

TEST_F(SafetensorsFileTest, LoadErrorsArePrefixedWithThePath) {
  const std::string path = Path("bad.safetensors");
  WriteRaw(path, "garbage");
  auto loaded = LoadSafetensors(path, Small());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(loaded.status().message().rfind(path + ": ", 0), 0u)
      << loaded.status();
}

// --- Decoding: accepted variations ------------------------------------------

TEST(SafetensorsDecode, AcceptsWhitespaceEscapesAndAnyTensorOrder) {
  // Reordered entries with reordered fields, a \u-escaped key, newlines.
  const std::string json =
      "{\n \"__metadata__\": {\"format\": \"pt\"},\n"
      " \"fc2.bias\": {\"data_offsets\": [96, 104], \"shape\": [2],"
      " \"dtype\": \"F32\"},\n"
      " \"fc1\\u002eweight\": {\"dtype\":\"F32\",\"shape\":[4,3],"
      "\"data_offsets\":[0,48]},\n"
      " \"fc2.weight\":{\"dtype\":\"F32\",\"shape\":[2,4],"
      "\"data_offsets\":[64,96]},"
      " \"fc1.bias\":{\"dtype\":\"F32\",\"shape\":[4],"
      "\"data_offsets\":[48,64]}\n}";
  const std::vector<float> p = SmallParams();
  std::string file = Le64(json.size()) + json;
  file.append(reinterpret_cast<const char*>(p.data()), kSmallDataBytes);
  auto decoded = DecodeSafetensors(Small(), file);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(SameBits(*decoded, p));
}

TEST(SafetensorsDecode, TensorsAreReadFromTheirOwnOffsets) {
  // fc1.bias and fc2.bias swap places in the data buffer.
  std::string json = Replace(kSmallJson, "\"data_offsets\":[48,64]",
                             "\"data_offsets\":[88,104]");
  json = Replace(json, "\"data_offsets\":[64,96]", "\"data_offsets\":[56,88]");
  json = Replace(json, "\"data_offsets\":[96,104]", "\"data_offsets\":[48,56]");
  std::vector<float> data(26);
  for (size_t i = 0; i < 26; ++i) data[i] = static_cast<float>(i);
  std::string file = Le64(json.size()) + json;
  file.append(reinterpret_cast<const char*>(data.data()), kSmallDataBytes);
  auto decoded = DecodeSafetensors(Small(), file);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  // Flat layout: fc1.weight 0..11, fc1.bias 12..15, fc2.weight 16..23,
  // fc2.bias 24..25. File data: fc1.weight, fc2.bias, fc2.weight, fc1.bias.
  const std::vector<float> want = {0,  1,  2,  3,  4,  5,  6,  7,  8,
                                   9,  10, 11, 22, 23, 24, 25, 14, 15,
                                   16, 17, 18, 19, 20, 21, 12, 13};
  EXPECT_EQ(*decoded, want);
}

// --- Decoding: rejected files -----------------------------------------------

TEST(SafetensorsDecode, EveryTruncationIsDataLoss) {
  const std::string bytes = EncodeSafetensors(Small(), SmallParams());
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto decoded = DecodeSafetensors(Small(), bytes.substr(0, len));
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss)
        << "truncated to " << len << " of " << bytes.size()
        << " bytes: " << decoded.status();
  }
  EXPECT_TRUE(
      Contains(DecodeSafetensors(Small(), bytes.substr(0, bytes.size() - 1))
                   .status()
                   .message(),
               "fc2.bias"));
}

TEST(SafetensorsDecode, HeaderLengthBeyondTheFileIsDataLoss) {
  std::string bytes = EncodeSafetensors(Small(), SmallParams());
  bytes.replace(0, 8, Le64(bytes.size()));
  auto decoded = DecodeSafetensors(Small(), bytes);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(decoded.status().message(), "header length"));
}

TEST(SafetensorsDecode, HeaderLengthOverOneHundredMegabytesIsDataLoss) {
  const std::string bytes = Le64(uint64_t{1} << 40) + "{}";
  auto decoded = DecodeSafetensors(Small(), bytes);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(decoded.status().message(), "limit"));
}

TEST(SafetensorsDecode, MalformedJsonIsDataLoss) {
  const std::string tail = std::string(kSmallJson).substr(1);  // after '{'
  const std::vector<std::string> bad = {
      "",
      "   ",
      "[1,2]",
      "\"fc1.weight\"",
      "{\"fc1.weight\":",
      "{\"fc1.weight\":{}",
      "{\"a\":1,}",
      "{\"a\" 1}",
      "{a:1}",
      "{\"a\":-1}",
      "{\"a\":1.5}",
      "{\"a\":1e3}",
      "{\"a\":01}",
      "{\"a\":18446744073709551616}",
      "{\"a\":true}",
      "{\"a\":null}",
      "{\"a\":\"x\ty\"}",
      "{\"a\":\"\\q\"}",
      "{\"a\":\"\\ud800\"}",
      "{\"a\":\"\xff\"}",
      "{\"a\":\"\xc0\xae\"}",
      "{\"a\":1} x",
      "{}{}",
      "{\"fc1.weight\":1," + tail,  // duplicate key
      std::string(1000, '[') + std::string(1000, ']'),
  };
  for (const std::string& json : bad) {
    const absl::Status s = DecodeSmall(json);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss)
        << "header: " << json.substr(0, 80) << "\nstatus: " << s;
  }
  EXPECT_TRUE(Contains(DecodeSmall("{\"fc1.weight\":1," + tail).message(),
                       "duplicate key \"fc1.weight\""));
}

TEST(SafetensorsDecode, WrongDtypeIsInvalidArgumentNamingTheTensor) {
  const absl::Status s =
      DecodeSmall(Replace(kSmallJson, R"("fc1.bias":{"dtype":"F32")",
                          R"("fc1.bias":{"dtype":"F16")"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "tensor \"fc1.bias\" has dtype F16, expected F32");
}

TEST(SafetensorsDecode, WrongShapeIsInvalidArgumentNamingTheTensor) {
  // Same element count, transposed: only the shape check can catch it.
  const absl::Status s =
      DecodeSmall(Replace(kSmallJson, "\"shape\":[4,3]", "\"shape\":[3,4]"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "tensor \"fc1.weight\" has shape [3,4], expected [4,3]");
}

TEST(SafetensorsDecode, ExtraDimensionIsAWrongShape) {
  const absl::Status s =
      DecodeSmall(Replace(kSmallJson, "\"shape\":[2]", "\"shape\":[2,1]"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "fc2.bias"));
}

TEST(SafetensorsDecode, MissingTensorIsInvalidArgumentNamingTheTensor) {
  const absl::Status s = DecodeSmall(Replace(
      kSmallJson,
      R"(,"fc2.bias":{"dtype":"F32","shape":[2],"data_offsets":[96,104]})",
      ""));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "tensor \"fc2.bias\" is missing");
}

TEST(SafetensorsDecode, ExtraTensorIsInvalidArgumentNamingTheTensor) {
  const absl::Status s =
      DecodeSmall(Replace(kSmallJson, "[96,104]}}",
                          R"([96,104]},"fc3.weight":{"dtype":"F32",)"
                          R"("shape":[1],"data_offsets":[104,108]}})"),
                  kSmallDataBytes + 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "\"fc3.weight\""));
}

TEST(SafetensorsDecode, OverlappingOffsetsAreDataLossNamingBothTensors) {
  const absl::Status s = DecodeSmall(
      Replace(kSmallJson, "[48,64]", "[40,56]"));  // inside fc1.weight
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(),
            "tensors \"fc1.weight\" and \"fc1.bias\" have overlapping "
            "data_offsets");
}

TEST(SafetensorsDecode, OffsetsNotSpanningTheTensorAreDataLoss) {
  for (const char* offsets : {"[48,60]", "[64,48]", "[48,68]"}) {
    const absl::Status s = DecodeSmall(Replace(kSmallJson, "[48,64]", offsets));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << offsets;
    EXPECT_TRUE(Contains(s.message(), "fc1.bias")) << offsets;
  }
}

TEST(SafetensorsDecode, OffsetsPastTheDataBufferAreDataLoss) {
  const absl::Status s =
      DecodeSmall(Replace(kSmallJson, "[96,104]", "[104,112]"));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "fc2.bias"));
}

TEST(SafetensorsDecode, MalformedTensorEntriesAreDataLoss) {
  const std::vector<std::pair<std::string, std::string>> edits = {
      {R"("dtype":"F32","shape":[4])", R"("shape":[4])"},
      {R"("dtype":"F32","shape":[4])", R"("dtype":32,"shape":[4])"},
      {"\"shape\":[4]", "\"shape\":4"},
      {"\"shape\":[4]", "\"shape\":[\"4\"]"},
      {"[48,64]", "[48,64,80]"},
      {"\"data_offsets\":[48,64]", "\"offsets\":[48,64]"},
      {"\"data_offsets\":[48,64]", "\"data_offsets\":[48,64],\"x\":1"},
  };
  for (const auto& [from, to] : edits) {
    const absl::Status s = DecodeSmall(Replace(kSmallJson, from, to));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << to << ": " << s;
    EXPECT_TRUE(Contains(s.message(), "fc1.bias")) << to;
  }
}

TEST(SafetensorsDecode, MetadataMustMapStringsToStrings) {
  const std::string json =
      "{\"__metadata__\":{\"step\":3}," + std::string(kSmallJson).substr(1);
  const absl::Status s = DecodeSmall(json);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "__metadata__"));
}

// --- ReadFile / WriteFileAtomic ---------------------------------------------

TEST_F(WriteFileAtomicTest, WritesThenReplacesContentsLeavingNoTemporary) {
  const std::string path = Path("f");
  const std::string first("a\0b", 3);
  ASSERT_TRUE(WriteFileAtomic(path, first).ok());
  EXPECT_EQ(ReadFile(path).value(), first);
  ASSERT_TRUE(WriteFileAtomic(path, "second").ok());
  EXPECT_EQ(ReadFile(path).value(), "second");
  ASSERT_TRUE(WriteFileAtomic(path, "").ok());
  EXPECT_EQ(ReadFile(path).value(), "");
  EXPECT_EQ(Entries(), std::set<std::string>{"f"});
}

TEST_F(WriteFileAtomicTest, ReadingAMissingFileIsNotFoundNamingThePath) {
  const std::string path = Path("absent");
  auto r = ReadFile(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(r.status().message(), path));
}

TEST_F(WriteFileAtomicTest, ReadingADirectoryFailsWithErrnoText) {
  auto r = ReadFile(dir_);
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), dir_));
  EXPECT_TRUE(Contains(r.status().message(), "Is a directory"));
}

TEST_F(WriteFileAtomicTest,
       MissingDirectoryFailsNamingThePathAndLeavesNothing) {
  const std::string path = Path("missing/f");
  const absl::Status s = WriteFileAtomic(path, "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(),
            absl::StrCat("cannot write ", path, ": No such file or directory"));
  EXPECT_TRUE(Entries().empty());
}

TEST_F(WriteFileAtomicTest, ParentThatIsAFileFailsAndKeepsTheFile) {
  WriteRaw(Path("plain"), "old");
  const std::string path = Path("plain/f");
  const absl::Status s = WriteFileAtomic(path, "x");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), path));
  EXPECT_TRUE(Contains(s.message(), "Not a directory"));
  EXPECT_EQ(ReadFile(Path("plain")).value(), "old");
  EXPECT_EQ(Entries(), std::set<std::string>{"plain"});
}

TEST_F(WriteFileAtomicTest, FailedRenameRemovesTheTemporaryAndKeepsTheOld) {
  // The target is a non-empty directory: the temporary file is written and
  // synced, then rename() fails.
  fs::create_directory(Path("target"));
  WriteRaw(Path("target/inside"), "old");
  const absl::Status s = WriteFileAtomic(Path("target"), "new");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), Path("target")));
  EXPECT_EQ(ReadFile(Path("target/inside")).value(), "old");
  EXPECT_EQ(Entries(), std::set<std::string>{"target"});
}

// Lowers RLIMIT_FSIZE (and ignores SIGXFSZ) for the scope, so that writes past
// `bytes` fail with EFBIG even for root.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ok_ = ::getrlimit(RLIMIT_FSIZE, &old_) == 0;
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    ok_ = ok_ && ::setrlimit(RLIMIT_FSIZE, &lim) == 0;
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  sighandler_t old_handler_;
  bool ok_ = false;
};

TEST_F(WriteFileAtomicTest, FailedWriteKeepsTheOldContentsAndRemovesTemporary) {
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteFileAtomic(path, "old contents").ok());
  absl::Status s;
  {
    FileSizeLimit limit(4096);
    ASSERT_TRUE(limit.ok()) << "setrlimit(RLIMIT_FSIZE) failed";
    s = WriteFileAtomic(path, std::string(1 << 20, 'n'));
  }
  EXPECT_EQ(s.message(),
            absl::StrCat("cannot write ", path, ": File too large"));
  EXPECT_EQ(ReadFile(path).value(), "old contents");
  EXPECT_EQ(Entries(), std::set<std::string>{"model.safetensors"});
}

// For its scope, this thread checks file permissions as an unprivileged
// user, even when the test runs as root (as it does in CI): setfsuid() from
// 0 drops CAP_DAC_OVERRIDE, which otherwise lets root write anywhere, and
// it changes only the calling thread. A no-op for other users, whose own
// permissions apply anyway.
class UnprivilegedFiles {
 public:
  static constexpr uid_t kNobody = 65534;
  UnprivilegedFiles() : was_root_(::geteuid() == 0) {
    if (was_root_) ::setfsuid(kNobody);
  }
  ~UnprivilegedFiles() {
    if (was_root_) ::setfsuid(0);
  }
  // True when permission checks now apply: not root, or the switch took.
  bool ok() const {
    return !was_root_ || ::setfsuid(static_cast<uid_t>(-1)) == kNobody;
  }

 private:
  const bool was_root_;
};

TEST_F(WriteFileAtomicTest, ReadOnlyDirectoryFailsAndKeepsTheOldContents) {
  const std::string path = Path("f");
  ASSERT_TRUE(WriteFileAtomic(path, "old").ok());
  const auto read_only = fs::perms::owner_read | fs::perms::owner_exec |
                         fs::perms::group_read | fs::perms::group_exec |
                         fs::perms::others_read | fs::perms::others_exec;
  // The control: the same user can write there while the directory is
  // writable, so the refusal below is the read-only directory's doing.
  fs::permissions(dir_, fs::perms::all);
  absl::Status control;
  {
    UnprivilegedFiles unprivileged;
    ASSERT_TRUE(unprivileged.ok()) << "setfsuid failed";
    control = WriteFileAtomic(Path("control"), "x");
  }
  fs::permissions(dir_, read_only);
  absl::Status s;
  {
    UnprivilegedFiles unprivileged;
    s = WriteFileAtomic(path, "new");
  }
  fs::permissions(dir_, fs::perms::owner_all);
  ASSERT_TRUE(control.ok()) << control;
  ASSERT_TRUE(fs::remove(Path("control")));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(),
            absl::StrCat("cannot write ", path, ": Permission denied"));
  EXPECT_EQ(ReadFile(path).value(), "old");
  EXPECT_EQ(Entries(), std::set<std::string>{"f"});
}

TEST(SafetensorsModel, TheWidthsOfAnyMlpAreReadFromItsWeightShapes) {
  for (const std::vector<int>& dims :
       {std::vector<int>{20, 64, 32, 3}, std::vector<int>{6, 4},
        std::vector<int>{784, 256, 128, 10}}) {
    const ModelLayout l = ModelLayout::Mlp(dims);
    const std::string bytes =
        EncodeSafetensors(l, std::vector<float>(l.num_params(), 0.5f));
    absl::StatusOr<ModelLayout> got = SafetensorsModel(bytes);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->is_mlp());
    EXPECT_EQ(got->dims(), dims);
  }
}

// A file whose tensors are an MLP's in another order is that MLP, laid
// out in the MLP's order.
TEST(SafetensorsModel, AnMlpsTensorsInAnyOrderAreThatMlp) {
  std::vector<TensorInfo> reversed = ModelLayout::Mlp({6, 5, 4}).tensors();
  std::reverse(reversed.begin(), reversed.end());
  for (TensorInfo& t : reversed) t.offset = t.size = 0;
  absl::StatusOr<ModelLayout> file = ModelLayout::FromTensors(reversed);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE(file->is_mlp());  // laid out in the order given
  absl::StatusOr<ModelLayout> got = SafetensorsModel(EncodeSafetensors(
      *file, std::vector<float>(file->num_params(), 1.0f)));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->is_mlp());
  EXPECT_EQ(got->dims(), (std::vector<int>{6, 5, 4}));
}

TEST(SafetensorsModel, OtherTensorsAreTheModelInTheOrderOfTheirData) {
  const ModelLayout l = ModelLayout::Mlp({20, 64, 32, 3});
  const std::string good =
      EncodeSafetensors(l, std::vector<float>(l.num_params(), 0.0f));
  // fc2 takes 33 inputs where fc1 gives 64 (the header's length is kept):
  // no MLP, a model of these six tensors in the file's order.
  const std::string broken =
      absl::StrReplaceAll(good, {{"\"shape\":[32,64]", "\"shape\":[32,33]"}});
  ASSERT_NE(broken, good);
  absl::StatusOr<ModelLayout> got = SafetensorsModel(broken);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->is_mlp());
  ASSERT_EQ(got->tensors().size(), 6u);
  EXPECT_EQ(got->tensors()[2].name, "fc2.weight");
  EXPECT_EQ(got->tensors()[2].shape, (std::vector<int64_t>{32, 33}));
  EXPECT_EQ(got->tensors()[3].offset, 20 * 64 + 64 + 32 * 33);

  const std::string bf16 =
      absl::StrReplaceAll(good, {{"\"dtype\":\"F32\",\"shape\":[64]",
                                  "\"dtype\":\"I32\",\"shape\":[64]"}});
  ASSERT_NE(bf16, good);
  absl::Status s = SafetensorsModel(bf16).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("tensor \"fc1.bias\" has dtype I32"),
            absl::string_view::npos)
      << s;
  const std::string zero_dim =
      absl::StrReplaceAll(good, {{"\"shape\":[3]", "\"shape\":[0]"}});
  s = SafetensorsModel(zero_dim).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("tensor \"fc3.bias\" [0]"),
            absl::string_view::npos)
      << s;
  EXPECT_EQ(SafetensorsModel("1234").status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace dp
