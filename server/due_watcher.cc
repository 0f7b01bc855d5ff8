// The loop of a thread that acts when something falls due.
#include "server/due_watcher.h"

#include <utility>

namespace dp {

DueWatcher::DueWatcher(absl::Mutex* mu, Calls calls)
    : mu_(mu), calls_(std::move(calls)), thread_([this] { Watch(); }) {}

DueWatcher::~DueWatcher() { thread_.join(); }

void DueWatcher::Watch() {
  for (;;) {
    const absl::Time due = calls_.run();
    absl::MutexLock lock(mu_);
    if (calls_.stopped()) return;
    auto wake = [this, due] { return calls_.stopped() || calls_.sooner(due); };
    mu_->AwaitWithTimeout(absl::Condition(&wake), due - calls_.clock());
    if (calls_.stopped()) return;
  }
}

}  // namespace dp
