// The step channels' pages and their serving threads (see step_channels.h).
#include "server/step_channels.h"

#include <unistd.h>

#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace dp {

struct StepChannels::Channel {
  Channel(int rank, uint64_t slot_id, std::unique_ptr<SharedRegion> region,
          ChannelSpin spin)
      : rank(rank),
        slot_id(slot_id),
        page(std::move(region)),
        server(page.get(), spin) {}
  const int rank;
  const uint64_t slot_id;
  const std::unique_ptr<SharedRegion> page;
  ChannelServer server;
  std::thread thread;
  absl::Mutex mu;
  bool answered ABSL_GUARDED_BY(mu) = true;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // No request of this page is waiting for its answer any more.
  absl::Condition Settled() {
    return absl::Condition(
        +[](Channel* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) {
          return c->answered || c->stopping;
        },
        this);
  }
};

StepChannels::StepChannels(Handler handler, ChannelSpin spin)
    : handler_(std::move(handler)), spin_(spin) {}

StepChannels::~StepChannels() { StopAll(); }

void StepChannels::Serve(const std::shared_ptr<Channel>& channel,
                         const Handler* handler) {
  ChannelRequest request;
  uint32_t seq = 0;
  while (channel->server.Next(&request, &seq)) {
    {
      // One request at a time: a request is handed on once the last one is
      // answered, so no worker has more than one wait pending in dp-ps. A
      // worker posts its next request only after reading the answer, so
      // this waits only for one that did not: the thread is not woken by
      // every answer, only by the next request.
      absl::MutexLock lock(&channel->mu);
      channel->mu.Await(channel->Settled());
      if (channel->stopping) return;
      channel->answered = false;
    }
    // The answer may come after this page is served no more (a new
    // registration of the rank, a shutdown): the page then stays mapped
    // until it has come, and nobody reads it.
    (*handler)(channel->rank, channel->slot_id, request,
               [channel, seq](const ChannelResponse& response) {  // holds it
                 absl::MutexLock lock(&channel->mu);
                 if (!channel->stopping) channel->server.Answer(seq, response);
                 channel->answered = true;
               });
  }
}

void StepChannels::Stop(Channel* channel, const absl::Status& why) {
  {
    // After this no answer is written: the closing status is the page's
    // last word.
    absl::MutexLock lock(&channel->mu);
    channel->stopping = true;
  }
  channel->server.Close(why);
  if (channel->thread.joinable()) channel->thread.join();
}

absl::StatusOr<int> StepChannels::Open(int rank, uint64_t slot_id) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<SharedRegion> region,
      SharedRegion::Create("dp-ps step channel", kStepChannelBytes));
  const int fd = dup(region->fd());
  if (fd < 0) return absl::InternalError("dup of a step channel's descriptor");
  auto channel =
      std::make_shared<Channel>(rank, slot_id, std::move(region), spin_);
  std::shared_ptr<Channel> previous;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      close(fd);
      return absl::UnavailableError("dp-ps is shutting down");
    }
    previous = std::exchange(open_[rank], channel);
    // The answer callbacks hold the channel, not this object: started
    // under the lock, so that StopAll sees every thread.
    channel->thread =
        std::thread([c = channel, h = &handler_] { Serve(c, h); });
  }
  // Outside the lock: the old thread may be inside the handler, which may
  // take locks of its own.
  if (previous != nullptr) {
    Stop(previous.get(),
         absl::FailedPreconditionError(absl::StrFormat(
             "another process of rank %d registered since: this one's step "
             "channel is closed (register again)",
             rank)));
  }
  return fd;
}

bool StepChannels::AwaitAnswered(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::shared_ptr<Channel>> open;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [rank, channel] : open_) open.push_back(channel);
  }
  bool all = true;
  for (const auto& channel : open) {
    absl::MutexLock lock(&channel->mu);
    all &= channel->mu.AwaitWithDeadline(channel->Settled(), deadline);
  }
  return all;
}

void StepChannels::StopAll() {
  std::vector<std::shared_ptr<Channel>> open;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    for (auto& [rank, channel] : open_) open.push_back(std::move(channel));
    open_.clear();
  }
  for (const auto& channel : open) {
    Stop(channel.get(), absl::UnavailableError("dp-ps is shutting down"));
  }
}

int64_t StepChannels::served() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [rank, channel] : open_) n += channel->server.served();
  return n;
}

}  // namespace dp
