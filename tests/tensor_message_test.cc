// Tensor messages: what SerializeWithTensor writes is the protobuf message,
// what ParseWithTensor reads from any slicing of protobuf's bytes is the
// message, the tensor is neither copied on the way out nor kept alive longer
// than gRPC needs it, and malformed bytes are refused, not misread.
#include "proto/tensor_message.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/dp.pb.h"

namespace dp {
namespace {

constexpr int kGradient = dp::v1::PushRequest::kGradientFieldNumber;

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 131 + 7);
  return s;
}

dp::v1::PushRequest Header() {
  dp::v1::PushRequest r;
  r.set_rank(3);
  r.set_step(123456789);
  r.set_loss(0.25f);
  r.set_num_samples(64);
  r.set_encoding(dp::v1::ENCODING_BF16);
  return r;
}

// `bytes` cut into slices of `piece` bytes (the last one shorter).
grpc::ByteBuffer Sliced(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < bytes.size(); i += piece) {
    slices.emplace_back(bytes.substr(i, piece));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

std::string TensorBytes(const ReceivedTensor& t) {
  std::string out(t.size(), '\0');
  t.CopyTo(out.data());
  return out;
}

TEST(TensorMessageTest, ProtobufReadsWhatIsWritten) {
  const std::string tensor = Pattern(100003);
  const grpc::ByteBuffer buffer =
      SerializeWithTensor(Header(), kGradient, tensor, nullptr);
  dp::v1::PushRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
  dp::v1::PushRequest expected = Header();
  expected.set_gradient(tensor);
  EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString());
}

TEST(TensorMessageTest, ReadsProtobufBytesHoweverTheyAreSliced) {
  dp::v1::PushRequest message = Header();
  message.set_gradient(Pattern(5000));
  const std::string bytes = message.SerializeAsString();
  for (size_t piece :
       {size_t{1}, size_t{2}, size_t{7}, size_t{4096}, bytes.size()}) {
    dp::v1::PushRequest header;
    ReceivedTensor tensor;
    ASSERT_TRUE(
        ParseWithTensor(Sliced(bytes, piece), kGradient, &header, &tensor).ok())
        << piece;
    EXPECT_TRUE(header.gradient().empty());
    dp::v1::PushRequest expected = Header();
    EXPECT_EQ(header.SerializeAsString(), expected.SerializeAsString());
    EXPECT_EQ(TensorBytes(tensor), message.gradient()) << piece;
    std::string scratch;
    EXPECT_EQ(std::string(tensor.Contiguous(&scratch)), message.gradient());
  }
}

TEST(TensorMessageTest, TheTensorIsSentFromItsOwnMemoryAndReleasedAfter) {
  auto owner = std::make_shared<std::string>(Pattern(4096));
  std::weak_ptr<std::string> watch = owner;
  {
    grpc::ByteBuffer buffer = SerializeWithTensor(
        Header(), kGradient, *owner, std::shared_ptr<const void>(owner));
    const std::string* raw = owner.get();
    owner.reset();
    EXPECT_FALSE(watch.expired()) << "the buffer keeps the tensor alive";
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(buffer.Dump(&slices).ok());
    ASSERT_EQ(slices.size(), 2u);
    EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()), raw->data())
        << "the tensor slice is the caller's memory, not a copy";
  }
  EXPECT_TRUE(watch.expired());
}

TEST(TensorMessageTest, OneReceivedPieceIsReadInPlace) {
  dp::v1::PushRequest message = Header();
  message.set_gradient(Pattern(64));
  const grpc::ByteBuffer buffer = Sliced(message.SerializeAsString(), 1 << 20);
  dp::v1::PushRequest header;
  ReceivedTensor tensor;
  ASSERT_TRUE(ParseWithTensor(buffer, kGradient, &header, &tensor).ok());
  std::string scratch;
  const absl::string_view view = tensor.Contiguous(&scratch);
  EXPECT_TRUE(scratch.empty()) << "no copy for a single piece";
  EXPECT_EQ(std::string(view), message.gradient());
}

TEST(TensorMessageTest, EmptyTensorIsWrittenAsProtobufWritesIt) {
  const grpc::ByteBuffer buffer =
      SerializeWithTensor(Header(), kGradient, "", nullptr);
  EXPECT_EQ(Flatten(buffer), Header().SerializeAsString());
  dp::v1::PushRequest header;
  ReceivedTensor tensor;
  ASSERT_TRUE(ParseWithTensor(buffer, kGradient, &header, &tensor).ok());
  EXPECT_EQ(tensor.size(), 0u);
  EXPECT_EQ(header.step(), Header().step());
}

TEST(TensorMessageTest, ARepeatedTensorFieldReplacesTheEarlierOne) {
  dp::v1::PushRequest first, second;
  first.set_gradient("first");
  second.set_gradient("second!");
  const std::string bytes = first.SerializeAsString() +
                            Header().SerializeAsString() +
                            second.SerializeAsString();
  dp::v1::PushRequest header;
  ReceivedTensor tensor;
  ASSERT_TRUE(
      ParseWithTensor(Sliced(bytes, 3), kGradient, &header, &tensor).ok());
  EXPECT_EQ(TensorBytes(tensor), "second!");
  dp::v1::PushRequest reference;
  ASSERT_TRUE(reference.ParseFromString(bytes));
  EXPECT_EQ(reference.gradient(), "second!");
}

TEST(TensorMessageTest, ATensorFieldOfAnotherWireTypeIsReadAsProtobufReadsIt) {
  // Field 4 as a varint: protobuf keeps it as an unknown field.
  const std::string bytes =
      Header().SerializeAsString() + std::string("\x20\x05", 2);
  dp::v1::PushRequest reference;
  ASSERT_TRUE(reference.ParseFromString(bytes));
  dp::v1::PushRequest header;
  ReceivedTensor tensor;
  ASSERT_TRUE(
      ParseWithTensor(Sliced(bytes, 1), kGradient, &header, &tensor).ok());
  EXPECT_EQ(tensor.size(), 0u);
  EXPECT_EQ(header.SerializeAsString(), reference.SerializeAsString());
}

TEST(TensorMessageTest, MalformedBytesAreRefusedNamingTheMessage) {
  dp::v1::PushRequest only_tensor;
  only_tensor.set_gradient(Pattern(300));
  const std::string tensor_only = only_tensor.SerializeAsString();
  struct Case {
    const char* what;
    std::string bytes;
  };
  const Case cases[] = {
      {"truncated tensor", tensor_only.substr(0, tensor_only.size() - 1)},
      {"field number 0", std::string("\x00\x01", 2)},
      {"group wire type", std::string("\x0b", 1)},
      {"unterminated varint", std::string(11, '\xff')},
      {"truncated fixed32 loss", std::string("\x2d\x00\x00", 3)},
      {"tensor longer than the message",
       std::string("\x22\xff\xff\xff\xff\x0f", 6)},
  };
  for (const Case& c : cases) {
    dp::v1::PushRequest header;
    ReceivedTensor tensor;
    const absl::Status s =
        ParseWithTensor(Sliced(c.bytes, 2), kGradient, &header, &tensor);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(s.message().find("dp.v1.PushRequest"), std::string::npos)
        << s.message();
  }
}

TEST(TensorMessageTest, EveryTruncationAgreesWithProtobuf) {
  dp::v1::PushRequest message = Header();
  message.set_gradient(Pattern(40));
  const std::string good = message.SerializeAsString();
  for (size_t len = 0; len < good.size(); ++len) {
    const std::string cut = good.substr(0, len);
    dp::v1::PushRequest reference;
    const bool protobuf_ok = reference.ParseFromString(cut);
    dp::v1::PushRequest header;
    ReceivedTensor tensor;
    const absl::Status s =
        ParseWithTensor(Sliced(cut, 5), kGradient, &header, &tensor);
    ASSERT_EQ(s.ok(), protobuf_ok) << "cut at " << len;
    if (s.ok()) {
      EXPECT_EQ(TensorBytes(tensor), reference.gradient());
      reference.clear_gradient();
      EXPECT_EQ(header.SerializeAsString(), reference.SerializeAsString());
    }
  }
}

TEST(TensorMessageTest, PlainMessagesRoundTrip) {
  dp::v1::PushResponse r;
  r.set_step(42);
  r.set_duplicate(true);
  dp::v1::PushResponse back;
  ASSERT_TRUE(ParseMessage(SerializeMessage(r), &back).ok());
  EXPECT_EQ(back.step(), 42);
  EXPECT_TRUE(back.duplicate());
  const absl::Status bad =
      ParseMessage(Sliced(std::string("\x08\xff", 2), 1), &back);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("dp.v1.PushResponse"), std::string::npos);
}

}  // namespace
}  // namespace dp
