// libFuzzer target over dp-ps's request path: input bytes -> a sequence of
// requests (a byte picks the RPC, the next bytes are parsed as its proto) ->
// RequestValidator -> a live StepCoordinator (a 12-parameter MLP, 2 ranks),
// mapped exactly as PsService maps them. After every request it checks:
//  - a refused request leaves step, params, m and v bitwise unchanged, and
//    the registered and pushed ranks as they were;
//  - the state changes only through accepted, non-duplicate pushes: the step
//    advances by exactly one when such a push completes the set of ranks, and
//    params, m, v change only then;
//  - params, m and v stay finite;
//  - the two layers agree: a request the validator passed is never
//    INVALID_ARGUMENT at the coordinator, except a gradient whose values the
//    coordinator refuses as it decodes them (the validator does not read
//    them);
//  - every wait callback runs at most once, never after a successful
//    CancelWait, and every pending one runs at shutdown.
// A record whose op byte has the top bit set skips the validator, to check
// that the coordinator's own defences keep the same state invariants.
//
// Input: records [op:1][len:1][body:len]; op & 15 == 8 is a closed
// connection (Attend and ConnectionClosed: body [rank][pick], pick's low bit
// naming the rank's current session or a stale one); else op & 7 picks
// Register, Pull, Push, Barrier, PushPull, ReportEval, GetStatus or
// CancelWait.
// DP_FUZZ_WRITE_SEEDS=DIR writes the seed corpus (tests/fuzz/corpus) to DIR;
// DP_FUZZ_TRACE=1 prints every request's outcome.
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/log.h"
#include "common/model_layout.h"
#include "proto/tensor_message.h"
#include "proto/wire.h"
#include "google/protobuf/stubs/logging.h"
#include "proto/dp.pb.h"
#include "server/ps_service.h"
#include "server/request_validator.h"
#include "server/step_coordinator.h"
#include "tests/same_state.h"

namespace dp {
namespace {

constexpr int kWorld = 2;
constexpr size_t kMaxRecords = 64;

enum Op : uint8_t {
  kRegister = 0,
  kPull,
  kPush,
  kBarrier,
  kPushPull,
  kReportEval,
  kGetStatus,
  kCancelWait,
  kConnectionClosed,
};
constexpr uint8_t kSkipValidator = 0x80;

const ModelLayout& Layout() {
  static const ModelLayout* layout =
      new ModelLayout(ModelLayout::Mlp({2, 2, 2}));
  return *layout;
}

#define FUZZ_CHECK(cond, ...)                                \
  do {                                                       \
    if (!(cond)) {                                           \
      std::fprintf(stderr, "invariant broken: %s: ", #cond); \
      std::fprintf(stderr, __VA_ARGS__);                     \
      std::fprintf(stderr, "\n");                            \
      std::abort();                                          \
    }                                                        \
  } while (0)

bool AllFinite(const std::vector<float>& x) {
  for (float f : x) {
    if (!std::isfinite(f)) return false;
  }
  return true;
}

// One wait handed to the coordinator: how often its callback ran.
struct Wait {
  int64_t id = 0;
  int calls = 0;
  bool cancelled = false;
};

class Harness {
 public:
  Harness() {
    JobConfig config;
    config.schedule.world_size = kWorld;
    config.schedule.batch_size = 1;
    config.schedule.epochs = 2;
    config.dataset = "synthetic";
    TrainingState state;
    state.params = InitParams(Layout(), 1);
    coordinator_ =
        std::make_unique<StepCoordinator>(Layout(), config, std::move(state));
    validator_ = std::make_unique<RequestValidator>(kWorld, Layout());
  }

  void Run(uint8_t op, const uint8_t* body, size_t len) {
    const bool validate = (op & kSkipValidator) == 0;
    const TrainingState before = coordinator_->Snapshot();
    const CoordinatorStatus status_before = coordinator_->Status();
    const int picked =
        (op & 15) == kConnectionClosed ? kConnectionClosed : op & 7;
    Outcome out = Apply(picked, validate, body, len);
    const TrainingState after = coordinator_->Snapshot();
    const CoordinatorStatus status_after = coordinator_->Status();
    if (trace_) {
      std::fprintf(stderr, "op %d%s -> %s; step %lld\n", picked,
                   validate ? "" : " (unvalidated)",
                   out.status.ToString().c_str(),
                   static_cast<long long>(after.step));
    }

    FUZZ_CHECK(
        AllFinite(after.params) && AllFinite(after.m) && AllFinite(after.v),
        "op %d", op);
    FUZZ_CHECK(
        status_after.total_steps == 0 || after.step <= status_after.total_steps,
        "step %lld of %lld", static_cast<long long>(after.step),
        static_cast<long long>(status_after.total_steps));
    if (validate && out.validated && !out.bad_gradient_values) {
      FUZZ_CHECK(out.status.code() != absl::StatusCode::kInvalidArgument,
                 "op %d passed the validator but the coordinator says %s", op,
                 out.status.ToString().c_str());
    }
    if (!out.status.ok()) {
      FUZZ_CHECK(SameState(before, after), "refused op %d changed the state",
                 op);
      FUZZ_CHECK(
          status_before.registered_ranks == status_after.registered_ranks &&
              status_before.pushed_ranks == status_after.pushed_ranks,
          "refused op %d changed the ranks", op);
      return;
    }
    if (out.counted_push) {
      std::vector<int> expected = status_before.pushed_ranks;
      expected.push_back(out.rank);
      std::sort(expected.begin(), expected.end());
      if (static_cast<int>(expected.size()) == kWorld) {
        FUZZ_CHECK(after.step == before.step + 1,
                   "the last push did not apply the step");
        FUZZ_CHECK(status_after.pushed_ranks.empty(), "pushes not reset");
      } else {
        FUZZ_CHECK(SameState(before, after),
                   "a partial push changed the state");
        FUZZ_CHECK(status_after.pushed_ranks == expected, "pushed ranks wrong");
      }
      return;
    }
    FUZZ_CHECK(SameState(before, after), "op %d changed the state", op);
    FUZZ_CHECK(status_before.pushed_ranks == status_after.pushed_ranks,
               "op %d changed the pushed ranks", op);
  }

  // Shuts down and checks that every pending wait was called exactly once.
  void Finish() {
    coordinator_->Shutdown();
    for (const auto& [id, w] : waits_) {
      FUZZ_CHECK(w->calls == (w->cancelled ? 0 : 1),
                 "wait %lld called %d times (cancelled %d)",
                 static_cast<long long>(id), w->calls, w->cancelled);
    }
  }

 private:
  struct Outcome {
    absl::Status status;
    bool validated = false;  // the validator passed it
    // A push whose gradient has a value the coordinator must refuse.
    bool bad_gradient_values = false;
    bool counted_push = false;  // an accepted push that was not a duplicate
    int rank = -1;
  };

  template <typename Request>
  bool Parse(const uint8_t* body, size_t len, Request* r) {
    return r->ParseFromArray(body, static_cast<int>(len));
  }

  // A push parsed as dp-ps parses it (tensor_message.h), from the bytes cut
  // into slices of 1 to 5 bytes, checked against protobuf's reading: what it
  // accepts, protobuf accepts with the same fields and tensor; what it
  // refuses and protobuf accepts can only hold a group (no dp.v1 message
  // has one).
  bool Parse(const uint8_t* body, size_t len, dp::v1::PushRequest* r) {
    dp::v1::PushRequest reference;
    const bool protobuf_ok =
        reference.ParseFromArray(body, static_cast<int>(len));
    const size_t piece = 1 + len % 5;
    std::vector<grpc::Slice> slices;
    for (size_t i = 0; i < len; i += piece) {
      slices.emplace_back(body + i, std::min(piece, len - i));
    }
    const grpc::ByteBuffer buffer(slices.data(), slices.size());
    ReceivedTensor tensor;
    const absl::Status s = ParseWithTensor(
        buffer, dp::v1::PushRequest::kGradientFieldNumber, r, &tensor);
    if (!s.ok()) {
      FUZZ_CHECK(!protobuf_ok || absl::StrContains(s.message(), "wire type"),
                 "protobuf reads what dp-ps refuses: %s",
                 std::string(s.message()).c_str());
      return false;
    }
    FUZZ_CHECK(protobuf_ok, "dp-ps reads what protobuf refuses");
    std::string gradient(tensor.size(), '\0');
    tensor.CopyTo(gradient.data());
    FUZZ_CHECK(gradient == reference.gradient(), "tensors differ: %zu vs %zu",
               gradient.size(), reference.gradient().size());
    r->set_gradient(gradient);
    FUZZ_CHECK(r->SerializeAsString() == reference.SerializeAsString(),
               "header fields differ");
    return true;
  }

  absl::Status Validate(bool validate, const google::protobuf::Message& m,
                        absl::Status s, Outcome* out) {
    if (!validate) return absl::OkStatus();
    (void)m;
    if (s.ok()) out->validated = true;
    return s;
  }

  // Registers a wait and checks the callback discipline.
  absl::Status Wait(int rank, int64_t step) {
    auto w = std::make_shared<struct Wait>();
    auto ticket = coordinator_->WaitForStep(
        rank, step, [w](const absl::Status&, int64_t, Block) { ++w->calls; });
    if (!ticket.ok()) return ticket.status();
    if (ticket->ready) return absl::OkStatus();
    // A callback may already have run (an eviction of an older wait runs
    // before WaitForStep returns, but never this wait's own).
    FUZZ_CHECK(w->calls == 0, "a new wait was called before it returned");
    w->id = ticket->id;
    waits_[ticket->id] = w;
    order_.push_back(ticket->id);
    for (const auto& [id, other] : waits_) {
      FUZZ_CHECK(other->calls <= 1, "wait %lld called %d times",
                 static_cast<long long>(id), other->calls);
    }
    return absl::OkStatus();
  }

  absl::Status Push(const dp::v1::PushRequest& r, Outcome* out) {
    // The fuzzer's job is float32 (kF32 is the default encoding).
    out->bad_gradient_values =
        r.gradient().size() % sizeof(float) == 0 &&
        FirstOutOfRange(Encoding::kF32, r.gradient().data(),
                        r.gradient().size() / sizeof(float),
                        kMaxAbsGradient) >= 0;
    auto pushed = coordinator_->Push(r.rank(), r.step(), r.offset(),
                                     r.gradient(), r.loss());
    if (!pushed.ok()) return pushed.status();
    out->counted_push = !pushed->duplicate;
    out->rank = r.rank();
    return absl::OkStatus();
  }

  Outcome Apply(int op, bool validate, const uint8_t* body, size_t len) {
    Outcome out;
    switch (op) {
      case kRegister: {
        dp::v1::RegisterRequest r;
        if (!Parse(body, len, &r)) return {absl::InvalidArgumentError("parse")};
        out.status = Validate(validate, r, CheckRequest(*validator_, r), &out);
        if (!out.status.ok()) return out;
        auto registered = RegisterAsRequested(*coordinator_, r);
        out.status = registered.status();
        if (registered.ok()) sessions_[registered->rank] = registered->session;
        return out;
      }
      case kPull: {
        dp::v1::PullRequest r;
        if (!Parse(body, len, &r)) return {absl::InvalidArgumentError("parse")};
        out.status = Validate(validate, r, CheckRequest(*validator_, r), &out);
        if (!out.status.ok()) return out;
        auto pulled = coordinator_->Pull(r.rank(), r.offset(), r.length());
        out.status = pulled.status();
        if (pulled.ok()) {
          const absl::string_view v = pulled->bytes;
          const absl::string_view all = pulled->snapshot;
          FUZZ_CHECK(v.data() >= all.data() &&
                         v.data() + v.size() <= all.data() + all.size() &&
                         v.size() % BytesPerValue(pulled->encoding) == 0,
                     "pull returned %zu bytes outside the snapshot", v.size());
        }
        return out;
      }
      case kPush: {
        dp::v1::PushRequest r;
        if (!Parse(body, len, &r)) return {absl::InvalidArgumentError("parse")};
        out.status = Validate(validate, r, CheckRequest(*validator_, r), &out);
        if (!out.status.ok()) return out;
        out.status = Push(r, &out);
        return out;
      }
      case kBarrier: {
        dp::v1::BarrierRequest r;
        if (!Parse(body, len, &r)) return {absl::InvalidArgumentError("parse")};
        out.status = Validate(validate, r, CheckRequest(*validator_, r), &out);
        if (!out.status.ok()) return out;
        out.status = Wait(r.rank(), r.step());
        return out;
      }
      case kPushPull: {
        dp::v1::PushRequest r;
        if (!Parse(body, len, &r)) return {absl::InvalidArgumentError("parse")};
        out.status = Validate(validate, r, CheckRequest(*validator_, r), &out);
        if (!out.status.ok()) return out;
        out.status = Push(r, &out);
        if (!out.status.ok()) return out;
        // The push stands; the wait and the pull change nothing.
        (void)Wait(r.rank(), r.step());
        (void)coordinator_->Pull(r.rank(), 0, 0);
        return out;
      }
      case kReportEval: {
        dp::v1::ReportEvalRequest r;
        if (!Parse(body, len, &r)) return {absl::InvalidArgumentError("parse")};
        out.status = Validate(validate, r, CheckRequest(*validator_, r), &out);
        if (!out.status.ok()) return out;
        out.status = coordinator_->RecordEval(r.rank(), FromProto(r));
        return out;
      }
      case kGetStatus: {
        dp::v1::GetStatusRequest r;
        if (!Parse(body, len, &r)) return {absl::InvalidArgumentError("parse")};
        out.status = Validate(validate, r, CheckRequest(*validator_, r), &out);
        if (!out.status.ok()) return out;
        (void)coordinator_->Status();
        return out;
      }
      case kConnectionClosed: {
        // A rank in [-3, 3] (out of range too), and its session or not.
        if (len < 2) return out;
        const int rank = static_cast<int8_t>(body[0]) % 4;
        const auto known = sessions_.find(rank);
        const uint64_t session = (body[1] & 1) && known != sessions_.end()
                                     ? known->second
                                     : uint64_t{body[1]};
        (void)coordinator_->Attend(rank, session);
        coordinator_->ConnectionClosed(rank, session);
        return out;
      }
      case kCancelWait: {
        if (order_.empty() || len == 0) return out;
        const int64_t id = order_[body[0] % order_.size()];
        struct Wait& w = *waits_[id];
        const int calls_before = w.calls;
        if (coordinator_->CancelWait(id)) {
          FUZZ_CHECK(calls_before == 0 && !w.cancelled,
                     "cancelled a wait that had run");
          w.cancelled = true;
        }
        return out;
      }
    }
    return out;
  }

  const bool trace_ = std::getenv("DP_FUZZ_TRACE") != nullptr;
  std::unique_ptr<StepCoordinator> coordinator_;
  std::unique_ptr<RequestValidator> validator_;
  std::map<int64_t, std::shared_ptr<struct Wait>> waits_;
  std::vector<int64_t> order_;
  std::map<int, uint64_t> sessions_;  // by rank, of its last registration
};

// --- Seed corpus ----------------------------------------------------------

void Add(std::string* input, uint8_t op, const google::protobuf::Message& m) {
  const std::string body = m.SerializeAsString();
  if (body.size() > 255) std::abort();
  input->push_back(static_cast<char>(op));
  input->push_back(static_cast<char>(body.size()));
  input->append(body);
}

dp::v1::RegisterRequest RegisterReq(int rank) {
  dp::v1::RegisterRequest r;
  r.set_rank(rank);
  r.set_model_fingerprint(Layout().Fingerprint());
  r.mutable_data()->set_num_samples(8);
  r.mutable_data()->set_hash(42);
  r.set_worker_id(absl::StrCat("host/", 100 + rank));
  return r;
}

dp::v1::PushRequest PushReq(int rank, int64_t step, float value) {
  dp::v1::PushRequest r;
  r.set_rank(rank);
  r.set_step(step);
  std::vector<float> g(Layout().num_params());
  for (size_t i = 0; i < g.size(); ++i) g[i] = value * (1.0f + i);
  r.set_gradient(std::string(reinterpret_cast<const char*>(g.data()),
                             g.size() * sizeof(float)));
  r.set_loss(2.3f);
  r.set_num_samples(1);
  return r;
}

dp::v1::BarrierRequest BarrierReq(int rank, int64_t step) {
  dp::v1::BarrierRequest r;
  r.set_rank(rank);
  r.set_step(step);
  return r;
}

void WriteSeeds(const std::string& dir) {
  std::map<std::string, std::string> seeds;
  {  // Two plain steps: push, push, barrier, pull, status, eval.
    std::string in;
    Add(&in, kRegister, RegisterReq(0));
    Add(&in, kRegister, RegisterReq(1));
    for (int step = 0; step < 2; ++step) {
      Add(&in, kPush, PushReq(0, step, 0.01f));
      Add(&in, kPush, PushReq(1, step, -0.02f));
      Add(&in, kBarrier, BarrierReq(0, step));
    }
    dp::v1::PullRequest pull;
    pull.set_rank(1);
    Add(&in, kPull, pull);
    Add(&in, kGetStatus, dp::v1::GetStatusRequest());
    dp::v1::ReportEvalRequest eval;
    eval.set_rank(0);
    eval.set_step(2);
    eval.set_epoch(1);
    eval.set_accuracy(0.5);
    eval.set_loss(1.2);
    eval.set_num_samples(8);
    Add(&in, kReportEval, eval);
    seeds["plain_steps"] = in;
  }
  {  // Fused calls: the first waits, the second applies the step.
    std::string in;
    Add(&in, kRegister, RegisterReq(0));
    Add(&in, kRegister, RegisterReq(1));
    Add(&in, kPushPull, PushReq(0, 0, 0.5f));
    Add(&in, kPushPull, PushReq(1, 0, 0.25f));
    Add(&in, kPushPull, PushReq(1, 0, 0.25f));  // retry: a duplicate
    Add(&in, kPushPull, PushReq(0, 1, 0.5f));
    seeds["fused_steps"] = in;
  }
  {  // Bad requests, through the validator and around it.
    for (uint8_t route : {uint8_t{0}, kSkipValidator}) {
      std::string in;
      Add(&in, route | kRegister, RegisterReq(0));
      Add(&in, route | kRegister, RegisterReq(1));
      dp::v1::PushRequest nan = PushReq(1, 0, 1.0f);
      float q = std::nanf("");
      std::memcpy(nan.mutable_gradient()->data() + 8, &q, sizeof(q));
      Add(&in, route | kPush, nan);
      Add(&in, route | kPush, PushReq(0, 0, 1e30f));  // out of range
      dp::v1::PushRequest short_grad = PushReq(0, 0, 1.0f);
      short_grad.mutable_gradient()->resize(20);
      Add(&in, route | kPush, short_grad);
      Add(&in, route | kPush, PushReq(5, 0, 1.0f));
      Add(&in, route | kPush, PushReq(0, -3, 1.0f));
      Add(&in, route | kPush, PushReq(0, 7, 1.0f));
      dp::v1::RegisterRequest wrong = RegisterReq(1);
      wrong.set_model_fingerprint(wrong.model_fingerprint() ^ 1);
      Add(&in, route | kRegister, wrong);
      dp::v1::RegisterRequest huge = RegisterReq(1);
      huge.mutable_data()->set_num_samples(int64_t{1} << 62);
      Add(&in, route | kRegister, huge);
      dp::v1::PullRequest pull;
      pull.set_rank(0);
      pull.set_offset(int64_t{1} << 62);
      pull.set_length(int64_t{1} << 62);
      Add(&in, route | kPull, pull);
      Add(&in, route | kBarrier, BarrierReq(0, -1));
      dp::v1::ReportEvalRequest eval;
      eval.set_accuracy(std::nan(""));
      Add(&in, route | kReportEval, eval);
      seeds[route ? "bad_requests_unvalidated" : "bad_requests"] = in;
    }
  }
  {  // More waits of one rank than the bound, and cancellations.
    std::string in;
    Add(&in, kRegister, RegisterReq(0));
    Add(&in, kRegister, RegisterReq(1));
    Add(&in, kPush, PushReq(0, 0, 0.1f));
    for (int i = 0; i < StepCoordinator::kMaxWaitsPerRank + 2; ++i) {
      Add(&in, kBarrier, BarrierReq(0, 0));
    }
    in.append({static_cast<char>(kCancelWait), 1, 0});
    in.append({static_cast<char>(kCancelWait), 1, 3});
    Add(&in, kPush, PushReq(1, 0, 0.1f));
    seeds["many_waits"] = in;
  }
  {  // Closed connections: rank 0's (its block goes to rank 1, which waits),
     // a stale session's, a bad rank's; then rank 0 registers again.
    std::string in;
    Add(&in, kRegister, RegisterReq(0));
    Add(&in, kRegister, RegisterReq(1));
    Add(&in, kPush, PushReq(1, 0, 0.1f));
    Add(&in, kBarrier, BarrierReq(1, 0));
    in.append({static_cast<char>(kConnectionClosed), 2, 0, 1});
    in.append({static_cast<char>(kConnectionClosed), 2, 1, 2});
    in.append({static_cast<char>(kConnectionClosed), 2, 3, 1});
    Add(&in, kRegister, RegisterReq(0));
    Add(&in, kPush, PushReq(0, 0, 0.1f));
    seeds["closed_connections"] = in;
  }
  for (const auto& [name, data] : seeds) {
    const std::string path = dir + "/" + name;
    if (absl::Status s = WriteFileAtomic(path, data); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      std::exit(1);
    }
    std::printf("wrote %s (%zu bytes)\n", path.c_str(), data.size());
  }
}

}  // namespace
}  // namespace dp

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  dp::SilenceLog();
  // Protobuf logs every string field that is not UTF-8; parsing fails then,
  // which is all the harness needs to know.
  google::protobuf::SetLogHandler(nullptr);
  if (const char* dir = std::getenv("DP_FUZZ_WRITE_SEEDS")) {
    dp::WriteSeeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dp::Harness harness;
  size_t pos = 0;
  for (size_t records = 0; records < dp::kMaxRecords && pos + 2 <= size;
       ++records) {
    const uint8_t op = data[pos];
    const size_t len = std::min<size_t>(data[pos + 1], size - pos - 2);
    harness.Run(op, data + pos + 2, len);
    pos += 2 + len;
  }
  harness.Finish();
  return 0;
}
