// dp-ps's ends of the step channels (common/step_channel.h): one page per
// registration of a rank on this host, handed over with its gradient slot,
// and one thread per page that turns each request the worker posts into the
// push and the wait a PushPull call makes, one request at a time.
#ifndef DP_SERVER_STEP_CHANNELS_H_
#define DP_SERVER_STEP_CHANNELS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/step_channel.h"

namespace dp {

class StepChannels {
 public:
  // Called once per request on the page's thread; `answer` must be called
  // exactly once, from any thread, now or when the step is applied.
  using Answer = std::function<void(const ChannelResponse&)>;
  using Handler =
      std::function<void(int rank, uint64_t slot_id,
                         const ChannelRequest& request, Answer answer)>;
  StepChannels(Handler handler, ChannelSpin spin);
  ~StepChannels();  // StopAll()

  // A fresh page for the registration of `rank` that got slot `slot_id`,
  // served from now on; the rank's previous page is served no more. A
  // descriptor of the page for the worker (the caller owns it).
  absl::StatusOr<int> Open(int rank, uint64_t slot_id);
  // Waits up to `timeout` until no page holds a request that was read and
  // not yet answered; false if one still does. The coordinator marks a rank
  // told of the job's failure when it refuses its request, and the page is
  // written just after, on the thread that refused: a dp-ps that stopped
  // serving in between would leave the worker to meet a closed page, not
  // its failure.
  bool AwaitAnswered(absl::Duration timeout) const;
  // Serves no page any more (before what the handler calls goes away).
  void StopAll();
  // Requests served over the pages open now (tests, metrics).
  int64_t served() const;

 private:
  struct Channel;
  static void Serve(const std::shared_ptr<Channel>& channel,
                    const Handler* handler);
  // Serves `channel` no more; its worker's waits end with `why`.
  static void Stop(Channel* channel, const absl::Status& why);

  const Handler handler_;
  const ChannelSpin spin_;
  mutable absl::Mutex mu_;
  std::map<int, std::shared_ptr<Channel>> open_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dp

#endif  // DP_SERVER_STEP_CHANNELS_H_
