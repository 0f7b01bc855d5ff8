// The step channel's page, its futex waits and its two ends (see
// step_channel.h).
#include "common/step_channel.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>
#include <ctime>

#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace dp {
namespace {

// Every field is an atomic (relaxed, lock-free): the other process may write
// any of them at any time, and a torn or changing value must be a value, not
// undefined behaviour. The sequence words order the rest: a body is written
// before its word is released, and read after the word is acquired.
struct alignas(64) RequestHalf {  // the worker writes it
  std::atomic<uint32_t> seq;      // dp-ps parks on it
  std::atomic<uint32_t> server_parked;
  std::atomic<int64_t> step;
  std::atomic<int32_t> block_first;
  std::atomic<int32_t> block_count;
  std::atomic<uint32_t> loss_bits;
  std::atomic<int32_t> num_samples;
  std::atomic<int32_t> encoding;
  std::atomic<uint32_t> idle;
  std::atomic<int32_t> kind;
};

struct alignas(64) ResponseHalf {  // dp-ps writes it
  std::atomic<uint32_t> seq;       // the request answered; the worker parks
  std::atomic<uint32_t> client_parked;
  std::atomic<int32_t> code;
  std::atomic<int64_t> step;
  std::atomic<int32_t> block_first;
  std::atomic<int32_t> block_count;
  std::atomic<uint32_t> flags;  // kDone | kWorkOnly
  std::atomic<uint32_t> message_bytes;
  char message[ChannelResponse::kMaxMessageBytes];
  // Set once, when dp-ps serves the page no more: every wait from then on
  // ends with this status (the answer fields are no longer written).
  std::atomic<uint32_t> closed;
  std::atomic<int32_t> closed_code;
  char closed_message[ChannelResponse::kMaxMessageBytes];
};

struct Page {
  RequestHalf request;
  ResponseHalf response;
};
static_assert(sizeof(Page) <= kStepChannelBytes);
// The Python worker (python/dp_ps/step_channel.py) writes and reads the
// page at these byte offsets.
static_assert(offsetof(Page, request.seq) == 0 &&
              offsetof(Page, request.server_parked) == 4 &&
              offsetof(Page, request.step) == 8 &&
              offsetof(Page, request.block_first) == 16 &&
              offsetof(Page, request.block_count) == 20 &&
              offsetof(Page, request.loss_bits) == 24 &&
              offsetof(Page, request.num_samples) == 28 &&
              offsetof(Page, request.encoding) == 32 &&
              offsetof(Page, request.idle) == 36 &&
              offsetof(Page, request.kind) == 40);
static_assert(offsetof(Page, response.seq) == 64 &&
              offsetof(Page, response.client_parked) == 68 &&
              offsetof(Page, response.code) == 72 &&
              offsetof(Page, response.step) == 80 &&
              offsetof(Page, response.block_first) == 88 &&
              offsetof(Page, response.block_count) == 92 &&
              offsetof(Page, response.flags) == 96 &&
              offsetof(Page, response.message_bytes) == 100 &&
              offsetof(Page, response.message) == 104 &&
              offsetof(Page, response.closed) == 1128 &&
              offsetof(Page, response.closed_code) == 1132 &&
              offsetof(Page, response.closed_message) == 1136);
static_assert(std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<int64_t>::is_always_lock_free,
              "the words are shared between processes");

constexpr uint32_t kDone = 1, kWorkOnly = 2;

Page* PageOf(SharedRegion* region) {
  return reinterpret_cast<Page*>(region->data());
}

// Not FUTEX_PRIVATE_FLAG: the word is in memory shared with another process.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               absl::Duration timeout) {
  timespec ts = absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected,
          timeout == absl::InfiniteDuration() ? nullptr : &ts, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX,
          nullptr, nullptr, 0);
}

// Spins until done() or for `spin`, whichever is first: done() then. Each
// look yields the core: with a core to spare the yield returns at once and
// the wait never halts its CPU (a sleeping CPU of a virtual machine takes
// the hypervisor's time to wake), and where processes outnumber cores the
// spinner steps behind whichever of them is runnable, the other end
// included, instead of taking half of its core. Measured on 2 cores: a
// 50 us spin that paused instead made the null step at N = 2 slower than
// no spin at all.
template <typename Done>
bool SpinUntil(Done done, absl::Duration spin) {
  if (done() || spin <= absl::ZeroDuration()) return done();
  const absl::Time until = absl::Now() + spin;
  do {
    if (done()) return true;
    sched_yield();
  } while (absl::Now() < until);
  return done();
}

}  // namespace

bool ChannelRequest::operator==(const ChannelRequest& o) const {
  return kind == o.kind && step == o.step && block_first == o.block_first &&
         block_count == o.block_count && loss == o.loss &&
         num_samples == o.num_samples && encoding == o.encoding &&
         idle == o.idle;
}

ChannelClient::ChannelClient(SharedRegion* page, ChannelSpin spin)
    : page_(page), spin_(spin) {
  DP_CHECK(page->size() >= kStepChannelBytes);
  // A fresh page is all zeros: the first request is 1.
  posted_ = PageOf(page_)->request.seq.load(std::memory_order_relaxed);
}

absl::StatusOr<ChannelResponse> ChannelClient::Call(
    const ChannelRequest& request, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  if (!answered_) {
    absl::StatusOr<ChannelResponse> last = Await(posted_, deadline);
    if (request == pending_ || !last.ok()) return last;
  }
  RequestHalf& r = PageOf(page_)->request;
  r.kind.store(static_cast<int32_t>(request.kind), std::memory_order_relaxed);
  r.step.store(request.step, std::memory_order_relaxed);
  r.block_first.store(request.block_first, std::memory_order_relaxed);
  r.block_count.store(request.block_count, std::memory_order_relaxed);
  uint32_t loss_bits;
  std::memcpy(&loss_bits, &request.loss, sizeof(loss_bits));
  r.loss_bits.store(loss_bits, std::memory_order_relaxed);
  r.num_samples.store(request.num_samples, std::memory_order_relaxed);
  r.encoding.store(request.encoding, std::memory_order_relaxed);
  r.idle.store(request.idle ? 1 : 0, std::memory_order_relaxed);
  // Sequentially consistent with the load of server_parked below, as dp-ps's
  // store of server_parked is with its load of seq: one of the two sees the
  // other, so dp-ps never parks on a request it missed.
  r.seq.store(++posted_, std::memory_order_seq_cst);
  pending_ = request;
  answered_ = false;
  if (r.server_parked.load(std::memory_order_seq_cst) != 0) FutexWake(&r.seq);
  return Await(posted_, deadline);
}

absl::StatusOr<ChannelResponse> ChannelClient::Await(uint32_t seq,
                                                     absl::Time deadline) {
  ResponseHalf& a = PageOf(page_)->response;
  for (;;) {
    const bool answered =
        SpinUntil([&] { return a.seq.load(std::memory_order_acquire) == seq; },
                  spin_.spin);
    // An answer that came is read even when the page or the attendance
    // closed after it, as a response that arrived before its connection
    // closed is (the job's failure, told just before dp-ps exits).
    if (!answered) {
      if (closed_.load()) {
        return absl::UnavailableError(
            "dp-ps ended this worker's attendance (it is gone or shutting "
            "down)");
      }
      if (a.closed.load(std::memory_order_acquire) != 0) {
        // Read again each time: the worker's own memory, which only it (or a
        // process it handed the page to) can spoil.
        const int32_t code = a.closed_code.load(std::memory_order_relaxed);
        return absl::Status(
            code == 0 ? absl::StatusCode::kUnavailable
                      : static_cast<absl::StatusCode>(code),
            std::string(a.closed_message,
                        strnlen(a.closed_message, sizeof(a.closed_message))));
      }
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(
            "no answer through shared memory before the wait's deadline");
      }
      a.client_parked.store(1, std::memory_order_seq_cst);
      const uint32_t now = a.seq.load(std::memory_order_seq_cst);
      if (now != seq && !closed_.load() &&
          a.closed.load(std::memory_order_seq_cst) == 0) {
        FutexWait(&a.seq, now, left);
      }
      a.client_parked.store(0, std::memory_order_relaxed);
      continue;
    }
    ChannelResponse out;
    out.code =
        static_cast<absl::StatusCode>(a.code.load(std::memory_order_relaxed));
    out.step = a.step.load(std::memory_order_relaxed);
    out.block_first = a.block_first.load(std::memory_order_relaxed);
    out.block_count = a.block_count.load(std::memory_order_relaxed);
    const uint32_t flags = a.flags.load(std::memory_order_relaxed);
    out.done = (flags & kDone) != 0;
    out.work_only = (flags & kWorkOnly) != 0;
    const size_t bytes = std::min<size_t>(
        a.message_bytes.load(std::memory_order_relaxed), sizeof(a.message));
    out.message.assign(a.message, bytes);
    answered_ = true;
    return out;
  }
}

void ChannelClient::Close() {
  closed_.store(true);
  FutexWake(&PageOf(page_)->response.seq);
}

ChannelServer::ChannelServer(SharedRegion* page, ChannelSpin spin)
    : page_(page), spin_(spin) {
  DP_CHECK(page->size() >= kStepChannelBytes);
  seen_ = PageOf(page_)->request.seq.load(std::memory_order_relaxed);
}

bool ChannelServer::Next(ChannelRequest* out, uint32_t* seq) {
  RequestHalf& r = PageOf(page_)->request;
  for (;;) {
    if (stopped_.load()) return false;
    uint32_t now = seen_;
    SpinUntil(
        [&] {
          now = r.seq.load(std::memory_order_acquire);
          return now != seen_;
        },
        spin_.spin);
    if (now == seen_) {
      r.server_parked.store(1, std::memory_order_seq_cst);
      now = r.seq.load(std::memory_order_seq_cst);
      if (now == seen_ && !stopped_.load()) {
        FutexWait(&r.seq, now, absl::InfiniteDuration());
      }
      r.server_parked.store(0, std::memory_order_relaxed);
      now = r.seq.load(std::memory_order_acquire);
      if (now == seen_) {
        idle_wakes_.fetch_add(1, std::memory_order_relaxed);
        if (++idle_in_a_row_ >= ChannelSpin::kIdleWakesBeforeBackoff &&
            spin_.idle_backoff > absl::ZeroDuration() && !stopped_.load()) {
          // A worker's request is read at most a backoff late: only the
          // worker waking dp-ps for nothing waits for it.
          backoffs_.fetch_add(1, std::memory_order_relaxed);
          absl::SleepFor(spin_.idle_backoff);
        }
        continue;
      }
    }
    idle_in_a_row_ = 0;
    // Stop() moves the word too: that is no request.
    if (stopped_.load()) return false;
    // One read of each field, into dp-ps's memory: whatever the worker
    // writes from now on changes nothing about this request.
    seen_ = now;
    *seq = now;
    out->kind =
        static_cast<ChannelKind>(r.kind.load(std::memory_order_relaxed));
    out->step = r.step.load(std::memory_order_relaxed);
    out->block_first = r.block_first.load(std::memory_order_relaxed);
    out->block_count = r.block_count.load(std::memory_order_relaxed);
    const uint32_t loss_bits = r.loss_bits.load(std::memory_order_relaxed);
    std::memcpy(&out->loss, &loss_bits, sizeof(out->loss));
    out->num_samples = r.num_samples.load(std::memory_order_relaxed);
    out->encoding = r.encoding.load(std::memory_order_relaxed);
    out->idle = r.idle.load(std::memory_order_relaxed) != 0;
    served_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
}

void ChannelServer::Answer(uint32_t seq, const ChannelResponse& response) {
  ResponseHalf& a = PageOf(page_)->response;
  a.code.store(static_cast<int32_t>(response.code), std::memory_order_relaxed);
  a.step.store(response.step, std::memory_order_relaxed);
  a.block_first.store(response.block_first, std::memory_order_relaxed);
  a.block_count.store(response.block_count, std::memory_order_relaxed);
  a.flags.store(
      (response.done ? kDone : 0) | (response.work_only ? kWorkOnly : 0),
      std::memory_order_relaxed);
  const size_t bytes = std::min(response.message.size(), sizeof(a.message));
  std::memcpy(a.message, response.message.data(), bytes);
  a.message_bytes.store(static_cast<uint32_t>(bytes),
                        std::memory_order_relaxed);
  a.seq.store(seq, std::memory_order_seq_cst);
  if (a.client_parked.load(std::memory_order_seq_cst) != 0) FutexWake(&a.seq);
}

void ChannelServer::Close(const absl::Status& why) {
  ResponseHalf& a = PageOf(page_)->response;
  a.closed_code.store(static_cast<int32_t>(why.code()),
                      std::memory_order_relaxed);
  const size_t bytes =
      std::min(why.message().size(), sizeof(a.closed_message) - 1);
  std::memcpy(a.closed_message, why.message().data(), bytes);
  a.closed_message[bytes] = '\0';
  a.closed.store(1, std::memory_order_seq_cst);
  FutexWake(&a.seq);
  Stop();
}

void ChannelServer::Stop() {
  stopped_.store(true);
  // The request word moves, so that a Next() between its look at stopped_
  // and its park does not park: the worker whose page this is is done with
  // it.
  PageOf(page_)->request.seq.fetch_add(1, std::memory_order_seq_cst);
  FutexWake(&PageOf(page_)->request.seq);
}

}  // namespace dp
