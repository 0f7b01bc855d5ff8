// The checkpoint file's bytes: encoding, verification, decoding.
#include "proto/checkpoint_format.h"

#include <zlib.h>

#include <cstring>

#include "absl/strings/str_format.h"
#include "proto/checkpoint.pb.h"
#include "proto/wire.h"

namespace dp {
namespace {

constexpr char kMagic[8] = {'D', 'P', 'C', 'K', 'P', 'T', '\0', '\1'};
constexpr size_t kHeaderBytes = 8 + 8 + 4;

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

absl::Status ToFloats(const std::string& bytes, int64_t n, const char* what,
                      std::vector<float>* out) {
  if (bytes.size() != static_cast<size_t>(n) * sizeof(float)) {
    return absl::DataLossError(absl::StrFormat("%s has %d bytes, expected %d",
                                               what, bytes.size(), n * 4));
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
  if (c.shard_count > 1) {
    proto.set_shard_count(c.shard_count);
    proto.set_shard_index(c.shard_index);
    proto.set_shard_offset(
        ShardRanges(layout, c.shard_count)[c.shard_index].offset);
  }
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
  if (bytes.size() < kHeaderBytes ||
      std::memcmp(bytes.data(), kMagic, 8) != 0) {
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
  // A schedule this build does not know would run as another one.
  if (!dp::v1::LrSchedule_IsValid(proto.config().optimizer().lr_schedule())) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the checkpoint's learning-rate schedule %d is none this dp-ps knows",
        proto.config().optimizer().lr_schedule()));
  }
  Checkpoint c;
  c.config = FromProto(proto.config());
  if (proto.has_data()) {
    c.data = DataFingerprint{proto.data().num_samples(), proto.data().hash()};
  }
  c.state.step = proto.step();
  int64_t n = layout.num_params();
  if (proto.shard_count() != 0) {
    ShardSpec spec;
    if (!MakeShardSpec(layout, proto.shard_count(), proto.shard_index(), &spec)
             .ok() ||
        spec.range.offset != proto.shard_offset()) {
      return absl::DataLossError(absl::StrFormat(
          "names shard %d of %d at offset %d, which this model does not have",
          proto.shard_index(), proto.shard_count(), proto.shard_offset()));
    }
    c.shard_count = spec.count;
    c.shard_index = spec.index;
    n = spec.range.length;
  }
  absl::Status s = ToFloats(proto.params(), n, "params", &c.state.params);
  if (s.ok()) s = ToFloats(proto.adam_m(), n, "Adam m", &c.state.m);
  if (s.ok()) s = ToFloats(proto.adam_v(), n, "Adam v", &c.state.v);
  if (!s.ok()) return s;
  if (c.state.step < 0) return absl::DataLossError("negative step");
  return c;
}

}  // namespace dp
