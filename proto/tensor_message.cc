// Protobuf wire format by hand for the one field protobuf would copy.
#include "proto/tensor_message.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_format.h"

namespace dp {
namespace {

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Sequential reads over the slices of a received message; a field may
// straddle slices.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices)
      : slices_(slices) {
    SkipEmpty();
  }

  bool done() const { return slice_ == slices_.size(); }

  // Reads a varint; its bytes are appended to *raw when raw is not null.
  bool Varint(uint64_t* value, std::string* raw) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) return false;
      const uint8_t b = slices_[slice_].begin()[pos_];
      Advance(1);
      if (raw != nullptr) raw->push_back(static_cast<char>(b));
      *value |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;  // more than 10 bytes
  }

  // Takes the next n bytes: appended to *raw, or as views into the slices
  // appended to *pieces, whichever is not null.
  bool Take(uint64_t n, std::string* raw,
            std::vector<absl::string_view>* pieces) {
    while (n > 0) {
      if (done()) return false;
      const grpc::Slice& s = slices_[slice_];
      const size_t len = std::min<uint64_t>(n, s.size() - pos_);
      const char* p = reinterpret_cast<const char*>(s.begin()) + pos_;
      if (raw != nullptr) raw->append(p, len);
      if (pieces != nullptr) pieces->emplace_back(p, len);
      Advance(len);
      n -= len;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    pos_ += n;
    if (pos_ == slices_[slice_].size()) {
      ++slice_;
      pos_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (slice_ < slices_.size() && slices_[slice_].size() == 0) ++slice_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t pos_ = 0;
};

void ReleaseOwner(void* owner) {
  delete static_cast<std::shared_ptr<const void>*>(owner);
}

}  // namespace

grpc::ByteBuffer SerializeWithTensor(
    const google::protobuf::MessageLite& header, int field_number,
    absl::string_view tensor, std::shared_ptr<const void> owner) {
  if (tensor.empty()) return SerializeMessage(header);  // as protobuf: no field
  std::string head = header.SerializeAsString();
  AppendVarint((static_cast<uint64_t>(field_number) << 3) | 2, &head);
  AppendVarint(tensor.size(), &head);
  grpc::Slice slices[2] = {
      grpc::Slice(head),
      // gRPC only reads the memory; the slice API just takes it non-const.
      grpc::Slice(const_cast<char*>(tensor.data()), tensor.size(),
                  &ReleaseOwner,
                  new std::shared_ptr<const void>(std::move(owner)))};
  return grpc::ByteBuffer(slices, 2);
}

grpc::ByteBuffer SerializeMessage(
    const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ParseMessage(const grpc::ByteBuffer& buffer,
                          google::protobuf::MessageLite* message) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (buffer.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    if (message->ParseFromString(bytes)) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("malformed %s", message->GetTypeName()));
}

void ReceivedTensor::CopyTo(char* out) const {
  for (absl::string_view p : pieces_) {
    std::memcpy(out, p.data(), p.size());
    out += p.size();
  }
}

absl::string_view ReceivedTensor::Contiguous(std::string* scratch) const {
  if (pieces_.size() == 1) return pieces_[0];
  if (scratch->size() < size_) scratch->resize(size_);
  CopyTo(scratch->data());
  return absl::string_view(scratch->data(), size_);
}

absl::Status ParseWithTensor(const grpc::ByteBuffer& buffer, int field_number,
                             google::protobuf::MessageLite* header,
                             ReceivedTensor* tensor) {
  const std::string type = header->GetTypeName();
  auto malformed = [&](const char* what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("malformed %s: %s", type, what));
  };
  *tensor = ReceivedTensor();
  if (!buffer.Dump(&tensor->slices_).ok()) {
    return malformed("the message cannot be read");
  }
  SliceReader in(tensor->slices_);
  std::string header_bytes;
  while (!in.done()) {
    std::string tag_bytes;
    uint64_t tag;
    if (!in.Varint(&tag, &tag_bytes)) return malformed("truncated field tag");
    const uint64_t field = tag >> 3;
    const int wire_type = static_cast<int>(tag & 7);
    if (field == 0) return malformed("field number 0");
    uint64_t len;
    // With another wire type the field falls through to the header, where
    // protobuf keeps it as an unknown field, as it would here.
    if (field == static_cast<uint64_t>(field_number) && wire_type == 2) {
      if (!in.Varint(&len, nullptr)) return malformed("truncated length");
      // A repeated occurrence replaces the earlier one, as in protobuf.
      tensor->pieces_.clear();
      tensor->size_ = len;
      if (!in.Take(len, nullptr, &tensor->pieces_)) {
        return malformed("truncated tensor");
      }
      continue;
    }
    header_bytes += tag_bytes;
    bool ok = false;
    switch (wire_type) {
      case 0:  // varint
        ok = in.Varint(&len, &header_bytes);
        break;
      case 1:  // fixed64
        ok = in.Take(8, &header_bytes, nullptr);
        break;
      case 2:  // length-delimited
        ok = in.Varint(&len, &header_bytes) &&
             in.Take(len, &header_bytes, nullptr);
        break;
      case 5:  // fixed32
        ok = in.Take(4, &header_bytes, nullptr);
        break;
      default:  // groups are not used by dp.v1
        return malformed("unsupported wire type");
    }
    if (!ok) return malformed("truncated field");
  }
  if (!header->ParseFromString(header_bytes)) {
    return malformed("a field has an invalid value");
  }
  return absl::OkStatus();
}

}  // namespace dp
