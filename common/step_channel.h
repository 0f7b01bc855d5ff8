// The step exchange of a worker on dp-ps's host without a call: one page of
// shared memory per registration (handed over with its gradient slot) in
// which the worker posts its step's push-and-wait - "block b of step t is in
// my slot" - as a sequence word, and dp-ps answers - "version t+1 is in
// shared memory", or more work, or an error - as another. Each side waits on
// the other's word with a futex (after a bounded spin), so a step costs two
// hand-offs instead of a gRPC call's framing, threads and epoll wake-ups.
//
// The worker owns the request half and can write anything into the page at
// any time. dp-ps reads the request once into private memory and decides on
// that copy only; it writes the answer and never reads it back; it serves
// one request at a time per page, so a worker that posts a million requests
// has at most one of them waiting in dp-ps. What the worker does to the
// answer half can only confuse itself.
#ifndef DP_COMMON_STEP_CHANNEL_H_
#define DP_COMMON_STEP_CHANNEL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/shared_memory.h"
#include "common/tensor_codec.h"

namespace dp {

// The page's size (a region of exactly this many bytes).
inline constexpr size_t kStepChannelBytes = 4096;

// What a request asks, as the call it stands for would: a push and the wait
// for the step (PushPull: shard 0's, which leads the step), a push alone
// (Push: the other shards', answered once the gradient is read), or the
// weights of version `step` in shared memory (Pull with a version: the
// other shards', once shard 0 answered).
enum class ChannelKind : int32_t { kPushPull = 0, kPush = 1, kPull = 2 };

// A push of the gradient in the worker's slot (or, idle, of nothing) and the
// wait for the step, or one of its halves (`kind`): the call's request, as
// far as shared memory needs it.
struct ChannelRequest {
  ChannelKind kind = ChannelKind::kPushPull;  // any value, as read
  int64_t step = 0;                           // kPull: the version asked for
  int32_t block_first = 0;
  int32_t block_count = 0;  // 0: micro-batch `rank` alone
  float loss = 0.0f;
  int32_t num_samples = 0;
  int32_t encoding = 0;  // Encoding of the gradient in the slot
  bool idle = false;
  bool operator==(const ChannelRequest& o) const;
};

// The answer: an error, or the weights of version `step` in shared memory
// (with the block of it to compute), or more work at `step`; to a kPush, the
// step the push counted for.
struct ChannelResponse {
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;  // with an error; cut to kMaxMessageBytes
  int64_t step = 0;
  int32_t block_first = 0;
  int32_t block_count = 0;
  bool done = false;
  bool work_only = false;
  static constexpr size_t kMaxMessageBytes = 1024;
};

// How long a waiting side spins on the other's word before it parks on the
// futex: a spin saves the two context switches of a park, and the wake-up of
// a sleeping CPU, where a core is free to spin on; each look yields, so where
// processes outnumber cores the spinner runs only while nobody else wants
// the core: 0 parks at once.
struct ChannelSpin {
  absl::Duration spin = absl::ZeroDuration();
  // dp-ps's end only: after kIdleWakesBeforeBackoff wake-ups in a row that
  // found no request (a worker's own wake comes after its request, so
  // that is a worker waking dp-ps for nothing), dp-ps sleeps this long
  // before each next park, so that a flood of wakes costs it at most one
  // look at the page per backoff. Zero: no backoff (a benchmark's baseline).
  absl::Duration idle_backoff = absl::Milliseconds(1);
  static constexpr int kIdleWakesBeforeBackoff = 64;
};

// The worker's end of one page.
class ChannelClient {
 public:
  // `page`: the mapped region (kStepChannelBytes, writable), not owned.
  explicit ChannelClient(SharedRegion* page, ChannelSpin spin = {});

  // Posts `request` and waits up to `timeout` for its answer. The same
  // request again while the last one is unanswered (a wait retried after
  // its deadline) waits for that one; another first waits out the last
  // one's answer. DEADLINE_EXCEEDED when no answer came in time (the
  // request stays posted); UNAVAILABLE once Close() was called.
  absl::StatusOr<ChannelResponse> Call(const ChannelRequest& request,
                                       absl::Duration timeout);
  // From any thread: dp-ps is gone (its attendance ended); every wait
  // returns UNAVAILABLE from now on.
  void Close();

 private:
  // Waits for the answer to request `seq`, until `deadline`.
  absl::StatusOr<ChannelResponse> Await(uint32_t seq, absl::Time deadline);

  SharedRegion* const page_;
  const ChannelSpin spin_;
  std::atomic<bool> closed_{false};
  uint32_t posted_ = 0;  // the last request's sequence number
  ChannelRequest pending_;
  bool answered_ = true;  // the last request's answer was read
};

// dp-ps's end of one page: Next() from the one thread that serves it;
// Answer() and Stop() from any.
class ChannelServer {
 public:
  explicit ChannelServer(SharedRegion* page, ChannelSpin spin = {});

  // Blocks until the worker posts a request after the last one read, or
  // Stop(): then false. *request is the private copy dp-ps decides on, and
  // *seq its sequence number, for its Answer.
  bool Next(ChannelRequest* request, uint32_t* seq);
  // Answers request `seq`, from any thread; Next() may have read a later
  // one meanwhile (a worker that posted without waiting for this answer
  // only confuses itself).
  void Answer(uint32_t seq, const ChannelResponse& response);
  // Next() returns false from now on, at once.
  void Stop();
  // Stop(), and every wait of the worker, the one in progress and any
  // later one, ends with `why` (not OK): the page is served no more.
  void Close(const absl::Status& why);
  // Requests read (for tests and metrics).
  int64_t served() const { return served_.load(); }
  // Wake-ups that found no new request (a worker waking dp-ps for nothing).
  int64_t idle_wakes() const { return idle_wakes_.load(); }
  // Backoffs slept for runs of such wake-ups.
  int64_t backoffs() const { return backoffs_.load(); }

 private:
  SharedRegion* const page_;
  const ChannelSpin spin_;
  std::atomic<bool> stopped_{false};
  uint32_t seen_ = 0;  // the last request's sequence number
  std::atomic<int64_t> served_{0};
  std::atomic<int64_t> idle_wakes_{0};
  std::atomic<int64_t> backoffs_{0};
  int idle_in_a_row_ = 0;
};

}  // namespace dp

#endif  // DP_COMMON_STEP_CHANNEL_H_
