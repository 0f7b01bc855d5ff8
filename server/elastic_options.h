// How the coordinator of a job elastic in its workers behaves: what a
// lost or late rank's blocks do, who leads, and the clocks and timeouts.
#ifndef DP_SERVER_ELASTIC_OPTIONS_H_
#define DP_SERVER_ELASTIC_OPTIONS_H_

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dp {

// What a lost rank (silent for its lease, or its connection closed) does to
// the job (--on_worker_loss).
enum class OnWorkerLoss {
  kReassign,  // its blocks go to the others
  kWait,      // the step waits for it to come back
  kFail,      // the job fails
};

// How the step's blocks follow the ranks (see BlockPlanner and
// StepCoordinator).
struct ElasticOptions {
  OnWorkerLoss on_worker_loss = OnWorkerLoss::kReassign;
  bool reassign() const { return on_worker_loss == OnWorkerLoss::kReassign; }
  // Straggler backups: at most this many late blocks a step are handed to
  // an idle rank as well; 0 turns straggler handling off.
  int backup_blocks = 1;
  // A block is late once the step has run straggler_factor times as long as
  // its first push took, and at least straggler_min_wait.
  double straggler_factor = 3.0;
  absl::Duration straggler_min_wait = absl::Milliseconds(20);
  // What the step's start, its first push and the straggler deadline are
  // read from; a test passes a clock it advances itself (it is called
  // under the coordinator's lock, from any thread).
  std::function<absl::Time()> clock = absl::Now;
  // The first step this process plans waits this long, from the first
  // registration, for every rank (world_size) to register, then starts
  // with those there (at least min_workers): workers starting together
  // start together, however long after dp-ps they come.
  absl::Duration start_wait = absl::Seconds(30);
  // A rank's lease (--worker_timeout_s): a rank whose connection is open
  // and that made a call within it, or waits in one, is held by its
  // process, and another process's registration of it is refused.
  absl::Duration lease = absl::Seconds(10);
};

}  // namespace dp

#endif  // DP_SERVER_ELASTIC_OPTIONS_H_
