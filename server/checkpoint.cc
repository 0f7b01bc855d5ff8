// Checkpoint encoding, verification, atomic writes and retention.
#include "server/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/log.h"
#include "proto/checkpoint.pb.h"

namespace dp {
namespace {

constexpr char kMagic[8] = {'D', 'P', 'C', 'K', 'P', 'T', '\0', '\1'};
constexpr size_t kHeaderBytes = 8 + 8 + 4;
constexpr char kPrefix[] = "ckpt-";
constexpr char kSuffix[] = ".dpckpt";

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

absl::Status ToFloats(const std::string& bytes, int64_t n, const char* what,
                      std::vector<float>* out) {
  if (bytes.size() != static_cast<size_t>(n) * sizeof(float)) {
    return absl::DataLossError(absl::StrFormat(
        "%s has %d bytes, expected %d", what, bytes.size(), n * 4));
  }
  out->resize(n);
  std::memcpy(out->data(), bytes.data(), bytes.size());
  return absl::OkStatus();
}

uint32_t Crc32(absl::string_view bytes) {
  return static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()),
            static_cast<uInt>(bytes.size())));
}

}  // namespace

std::string CheckpointFileName(int64_t step) {
  return absl::StrFormat("%s%012d%s", kPrefix, step, kSuffix);
}

std::string EncodeCheckpoint(const ModelLayout& layout, const Checkpoint& c) {
  dp::v1::Checkpoint proto;
  proto.set_model_fingerprint(layout.Fingerprint());
  ToProto(c.config, proto.mutable_config());
  if (c.data.has_value()) {
    proto.mutable_data()->set_num_samples(c.data->num_samples);
    proto.mutable_data()->set_hash(c.data->hash);
  }
  proto.set_step(c.state.step);
  proto.set_params(FloatBytes(c.state.params));
  proto.set_adam_m(FloatBytes(c.state.m));
  proto.set_adam_v(FloatBytes(c.state.v));
  std::string payload;
  proto.SerializeToString(&payload);
  std::string out(kHeaderBytes, '\0');
  std::memcpy(out.data(), kMagic, 8);
  const uint64_t len = payload.size();
  std::memcpy(out.data() + 8, &len, 8);  // little-endian host
  const uint32_t crc = Crc32(payload);
  std::memcpy(out.data() + 16, &crc, 4);
  out += payload;
  return out;
}

absl::StatusOr<Checkpoint> DecodeCheckpoint(const ModelLayout& layout,
                                            absl::string_view bytes) {
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    return absl::DataLossError("not a dp-ps checkpoint (bad magic)");
  }
  uint64_t len = 0;
  uint32_t crc = 0;
  std::memcpy(&len, bytes.data() + 8, 8);
  std::memcpy(&crc, bytes.data() + 16, 4);
  if (len != bytes.size() - kHeaderBytes) {
    return absl::DataLossError(absl::StrFormat(
        "truncated or padded: the header announces %d payload bytes, the file "
        "has %d",
        len, bytes.size() - kHeaderBytes));
  }
  const absl::string_view payload = bytes.substr(kHeaderBytes);
  if (Crc32(payload) != crc) {
    return absl::DataLossError("checksum mismatch: the file is corrupt");
  }
  dp::v1::Checkpoint proto;
  if (!proto.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError("the payload does not parse");
  }
  if (proto.model_fingerprint() != layout.Fingerprint()) {
    return absl::FailedPreconditionError(
        "the checkpoint holds a different model");
  }
  Checkpoint c;
  c.config = FromProto(proto.config());
  if (proto.has_data()) {
    c.data = DataFingerprint{proto.data().num_samples(), proto.data().hash()};
  }
  c.state.step = proto.step();
  const int64_t n = layout.num_params();
  absl::Status s = ToFloats(proto.params(), n, "params", &c.state.params);
  if (s.ok()) s = ToFloats(proto.adam_m(), n, "Adam m", &c.state.m);
  if (s.ok()) s = ToFloats(proto.adam_v(), n, "Adam v", &c.state.v);
  if (!s.ok()) return s;
  if (c.state.step < 0) return absl::DataLossError("negative step");
  return c;
}

CheckpointStore::CheckpointStore(std::string dir, ModelLayout layout, int keep)
    : dir_(std::move(dir)), layout_(std::move(layout)), keep_(std::max(1, keep)) {
  writer_ = std::thread([this] { WriterLoop(); });
}

CheckpointStore::~CheckpointStore() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  writer_.join();
}

absl::Status CheckpointStore::Open() {
  if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot create checkpoint directory %s: %s", dir_, std::strerror(errno)));
  }
  struct stat st;
  if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint directory %s is not a directory", dir_));
  }
  const std::string probe = dir_ + "/.write-probe";
  if (absl::Status s = WriteFileAtomic(probe, "probe"); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint directory %s is not writable: %s", dir_, s.message()));
  }
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

std::vector<std::pair<int64_t, std::string>> CheckpointStore::ListNewestFirst()
    const {
  std::vector<std::pair<int64_t, std::string>> files;
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return files;
  while (struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    absl::string_view number = name;
    int64_t step;
    if (absl::ConsumePrefix(&number, kPrefix) &&
        absl::ConsumeSuffix(&number, kSuffix) &&
        absl::SimpleAtoi(number, &step)) {
      files.emplace_back(step, dir_ + "/" + name);
    }
  }
  ::closedir(d);
  std::sort(files.rbegin(), files.rend());
  return files;
}

std::optional<Checkpoint> CheckpointStore::LoadNewest() const {
  for (const auto& [step, path] : ListNewestFirst()) {
    auto bytes = ReadFile(path);
    if (!bytes.ok()) {
      Log("skipping checkpoint %s: %s", path, bytes.status().message());
      continue;
    }
    auto c = DecodeCheckpoint(layout_, *bytes);
    if (!c.ok()) {
      Log("skipping checkpoint %s: %s", path, c.status().message());
      continue;
    }
    if (c->state.step != step) {
      Log("skipping checkpoint %s: it holds step %d", path, c->state.step);
      continue;
    }
    return std::move(*c);
  }
  return std::nullopt;
}

absl::Status CheckpointStore::Write(const Checkpoint& c) {
  absl::MutexLock lock(&write_mu_);
  const std::string path = dir_ + "/" + CheckpointFileName(c.state.step);
  if (absl::Status s = WriteFileAtomic(path, EncodeCheckpoint(layout_, c));
      !s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("cannot write checkpoint of "
                                                  "step %d: %s",
                                                  c.state.step, s.message()));
  }
  // Retention only after the new file is safely in place.
  auto files = ListNewestFirst();
  for (size_t i = keep_; i < files.size(); ++i) ::unlink(files[i].second.c_str());
  return absl::OkStatus();
}

void CheckpointStore::WriteAsync(Checkpoint c) {
  absl::MutexLock lock(&mu_);
  pending_ = std::move(c);
}

void CheckpointStore::Flush() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !pending_.has_value() && !writing_;
  };
  mu_.Await(absl::Condition(&idle));
}

int64_t CheckpointStore::failures() const {
  absl::MutexLock lock(&mu_);
  return failures_;
}

void CheckpointStore::WriterLoop() {
  for (;;) {
    Checkpoint c;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return pending_.has_value() || stop_;
      };
      mu_.Await(absl::Condition(&ready));
      if (!pending_.has_value()) return;  // stopping, nothing left
      c = std::move(*pending_);
      pending_.reset();
      writing_ = true;
    }
    absl::Status s = Write(c);
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!s.ok()) {
      ++failures_;
      Log("error: %s; training goes on, the last good checkpoint stays",
          s.message());
    }
  }
}

}  // namespace dp
