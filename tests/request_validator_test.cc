// RequestValidator: every field of every request, at and beyond its bounds.
#include "server/request_validator.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "server/adam.h"
#include "server/ps_service.h"

namespace dp {
namespace {

constexpr int kWorld = 3;

class RequestValidatorTest : public ::testing::Test {
 protected:
  dp::v1::RegisterRequest Register() const {
    dp::v1::RegisterRequest r;
    r.set_rank(2);
    r.set_model_fingerprint(layout_.Fingerprint());
    r.mutable_data()->set_num_samples(60000);
    r.mutable_data()->set_hash(1);
    r.set_worker_id("node-1/1234");
    return r;
  }
  dp::v1::PushRequest Push() const {
    dp::v1::PushRequest r;
    r.set_rank(1);
    r.set_step(7);
    std::vector<float> g(layout_.num_params(), 0.5f);
    r.set_gradient(std::string(reinterpret_cast<const char*>(g.data()),
                               g.size() * sizeof(float)));
    r.set_loss(2.0f);
    r.set_num_samples(64);
    return r;
  }
  static void SetFloat(dp::v1::PushRequest* r, int64_t i, float value) {
    std::memcpy(r->mutable_gradient()->data() + i * sizeof(float), &value,
                sizeof(value));
  }
  absl::StatusCode Code(const google::protobuf::Message& m) const {
    if (auto* r = dynamic_cast<const dp::v1::RegisterRequest*>(&m)) {
      return CheckRequest(validator_, *r).code();
    }
    if (auto* r = dynamic_cast<const dp::v1::PullRequest*>(&m)) {
      return CheckRequest(validator_, *r).code();
    }
    if (auto* r = dynamic_cast<const dp::v1::PushRequest*>(&m)) {
      return CheckRequest(validator_, *r).code();
    }
    if (auto* r = dynamic_cast<const dp::v1::BarrierRequest*>(&m)) {
      return CheckRequest(validator_, *r).code();
    }
    if (auto* r = dynamic_cast<const dp::v1::ReportEvalRequest*>(&m)) {
      return CheckRequest(validator_, *r).code();
    }
    return absl::StatusCode::kUnknown;
  }

  const ModelLayout layout_ = ModelLayout::Mlp({6, 5, 4});
  const RequestValidator validator_{kWorld, layout_};
};

constexpr auto kOk = absl::StatusCode::kOk;
constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

TEST_F(RequestValidatorTest, RegisterChecksRankModelDataAndWorkerId) {
  EXPECT_EQ(Code(Register()), kOk);
  auto r = Register();
  for (int rank : {-1, kWorld, std::numeric_limits<int>::min()}) {
    r = Register();
    r.set_rank(rank);
    EXPECT_EQ(Code(r), kInvalid) << rank;
  }
  r = Register();
  r.set_model_fingerprint(r.model_fingerprint() + 1);
  EXPECT_EQ(Code(r), absl::StatusCode::kFailedPrecondition);
  r = Register();
  r.clear_data();
  EXPECT_EQ(Code(r), kInvalid);
  for (int64_t n : {int64_t{0}, int64_t{-5}, kMaxSamples + 1,
                    std::numeric_limits<int64_t>::max()}) {
    r = Register();
    r.mutable_data()->set_num_samples(n);
    EXPECT_EQ(Code(r), kInvalid) << n;
  }
  r = Register();
  r.mutable_data()->set_num_samples(kMaxSamples);
  EXPECT_EQ(Code(r), kOk);
  r = Register();
  r.set_worker_id(std::string(kMaxWorkerIdBytes, 'a'));
  EXPECT_EQ(Code(r), kOk);
  r.set_worker_id(std::string(kMaxWorkerIdBytes + 1, 'a'));
  EXPECT_EQ(Code(r), kInvalid);
  for (const char* id : {"a\nforged log line", "tab\t", "\x7f", "\xc3\xa9"}) {
    r.set_worker_id(id);
    EXPECT_EQ(Code(r), kInvalid) << id;
  }
}

TEST_F(RequestValidatorTest, PullRangeStaysInsideTheVectorWithoutOverflow) {
  const int64_t n = layout_.num_params();
  struct Range {
    int64_t offset, length;
    absl::StatusCode code;
  };
  const int64_t big = std::numeric_limits<int64_t>::max();
  const Range ranges[] = {
      {0, 0, kOk},        {0, n, kOk},          {n, 0, kOk},
      {3, n - 3, kOk},    {3, n - 2, kInvalid}, {-1, 0, kInvalid},
      {0, -1, kInvalid},  {n + 1, 0, kInvalid}, {big, big, kInvalid},
      {1, big, kInvalid}, {big, 1, kInvalid},
  };
  for (const Range& r : ranges) {
    dp::v1::PullRequest p;
    p.set_rank(0);
    p.set_offset(r.offset);
    p.set_length(r.length);
    EXPECT_EQ(Code(p), r.code) << r.offset << " " << r.length;
  }
  dp::v1::PullRequest p;
  p.set_rank(kWorld);
  EXPECT_EQ(Code(p), kInvalid);
}

TEST_F(RequestValidatorTest, PushChecksSizeLossStepAndRankButNotValues) {
  EXPECT_EQ(Code(Push()), kOk);
  auto r = Push();
  r.mutable_gradient()->pop_back();
  EXPECT_EQ(Code(r), kInvalid);
  r = Push();
  r.mutable_gradient()->append(4, '\0');
  EXPECT_EQ(Code(r), kInvalid);
  r = Push();
  r.clear_gradient();
  EXPECT_EQ(Code(r), kInvalid);
  r = Push();
  r.set_offset(1);
  EXPECT_EQ(Code(r), kInvalid);
  // The gradient's values are read once, by the coordinator as it decodes
  // them (StepCoordinatorTest.GradientValuesAreCheckedAsTheyAreDecoded).
  r = Push();
  SetFloat(&r, 0, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(Code(r), kOk);
  for (float loss : {std::numeric_limits<float>::quiet_NaN(),
                     std::numeric_limits<float>::infinity(), 1e30f}) {
    r = Push();
    r.set_loss(loss);
    EXPECT_EQ(Code(r), kInvalid) << loss;
  }
  for (int64_t step :
       {int64_t{-1}, kMaxStep + 1, std::numeric_limits<int64_t>::min()}) {
    r = Push();
    r.set_step(step);
    EXPECT_EQ(Code(r), kInvalid) << step;
  }
  r = Push();
  r.set_rank(-1);
  EXPECT_EQ(Code(r), kInvalid);
  r = Push();
  r.set_num_samples(-1);
  EXPECT_EQ(Code(r), kInvalid);
}

TEST_F(RequestValidatorTest, BarrierAndReportEvalChecks) {
  dp::v1::BarrierRequest b;
  b.set_rank(1);
  b.set_step(0);
  EXPECT_EQ(Code(b), kOk);
  b.set_step(-1);
  EXPECT_EQ(Code(b), kInvalid);
  b.set_step(1);
  b.set_rank(kWorld);
  EXPECT_EQ(Code(b), kInvalid);

  dp::v1::ReportEvalRequest e;
  e.set_rank(0);
  e.set_step(10);
  e.set_epoch(1);
  e.set_accuracy(0.8);
  e.set_loss(0.5);
  e.set_num_samples(10000);
  EXPECT_EQ(Code(e), kOk);
  for (double accuracy : {-0.1, 1.1, std::nan("")}) {
    auto bad = e;
    bad.set_accuracy(accuracy);
    EXPECT_EQ(Code(bad), kInvalid) << accuracy;
  }
  for (double loss : {std::nan(""), HUGE_VAL, 1e300}) {
    auto bad = e;
    bad.set_loss(loss);
    EXPECT_EQ(Code(bad), kInvalid) << loss;
  }
  auto bad = e;
  bad.set_epoch(-1);
  EXPECT_EQ(Code(bad), kInvalid);
  bad = e;
  bad.set_num_samples(-1);
  EXPECT_EQ(Code(bad), kInvalid);
  bad = e;
  bad.set_step(-1);
  EXPECT_EQ(Code(bad), kInvalid);
}

TEST(FirstOutOfRangeTest, FindsTheFirstBadGradientValueAnywhere) {
  std::vector<float> g(1000, 1.0f);
  const char* bytes = reinterpret_cast<const char*>(g.data());
  auto first = [&](int64_t n) {
    return FirstOutOfRange(Encoding::kF32, bytes, n, kMaxAbsGradient);
  };
  EXPECT_EQ(first(g.size()), -1);
  g[999] = std::nanf("");
  g[500] = 2 * kMaxAbsGradient;
  EXPECT_EQ(first(g.size()), 500);
  EXPECT_EQ(first(500), -1);
  EXPECT_EQ(first(0), -1);
}

}  // namespace
}  // namespace dp
