// dp.v1 messages that carry one tensor (PushRequest.gradient,
// PullResponse.params), moved between gRPC and the parameter store without
// protobuf's copies: on the way out the tensor's memory becomes a slice of
// the grpc::ByteBuffer (one weights snapshot serves every worker); on the way
// in it is read straight from the received slices. The bytes on the wire are
// those protobuf writes with the tensor field last, so any dp.v1 client or
// server, generated in any language, reads and writes them unchanged.
#ifndef DP_PROTO_TENSOR_MESSAGE_H_
#define DP_PROTO_TENSOR_MESSAGE_H_

#include <google/protobuf/message_lite.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dp {

// `header` serialised, followed by field `field_number` (a bytes field that
// `header` leaves empty) holding `tensor`. The tensor is not copied: its
// memory is referenced until gRPC is done with it, and `owner` (may be null
// when the memory outlives the call) is kept alive until then.
grpc::ByteBuffer SerializeWithTensor(
    const google::protobuf::MessageLite& header, int field_number,
    absl::string_view tensor, std::shared_ptr<const void> owner);

// A message without a tensor, as gRPC's protobuf codec would (de)serialise
// it; for the other half of a call whose tensor half is raw.
grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& message);
// INVALID_ARGUMENT, naming the message type, for malformed bytes.
absl::Status ParseMessage(const grpc::ByteBuffer& buffer,
                          google::protobuf::MessageLite* message);

// The tensor of a received message: pieces of the received slices, in order.
class ReceivedTensor {
 public:
  size_t size() const { return size_; }
  // Copies the size() bytes to `out`.
  void CopyTo(char* out) const;
  // The bytes in one piece: a view of the slice when there is one piece,
  // otherwise copied into *scratch (resized as needed).
  absl::string_view Contiguous(std::string* scratch) const;

 private:
  friend absl::Status ParseWithTensor(const grpc::ByteBuffer&, int,
                                      google::protobuf::MessageLite*,
                                      ReceivedTensor*);
  std::vector<grpc::Slice> slices_;  // keep the pieces alive
  std::vector<absl::string_view> pieces_;
  size_t size_ = 0;
};

// Parses `buffer` into `header` (every field but `field_number`) and
// `tensor` (field `field_number`, which must be length-delimited; absent
// means empty). INVALID_ARGUMENT, naming the message type, for bytes that
// are not a well-formed message.
absl::Status ParseWithTensor(const grpc::ByteBuffer& buffer, int field_number,
                             google::protobuf::MessageLite* header,
                             ReceivedTensor* tensor);

}  // namespace dp

#endif  // DP_PROTO_TENSOR_MESSAGE_H_
