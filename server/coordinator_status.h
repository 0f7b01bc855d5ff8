// What a StepCoordinator reports of itself: the job's step, who takes part
// and whom the step waits for, and what it counted since the start. Read by
// PsServer (progress, the loss policy, the end), by the metrics at scrape
// time and by GetStatus; StepCoordinator::Status (coordinator_status.cc)
// fills it under the coordinator's lock.
#ifndef DP_SERVER_COORDINATOR_STATUS_H_
#define DP_SERVER_COORDINATOR_STATUS_H_

#include <cstdint>
#include <vector>

#include "common/dataset.h"
#include "common/job_config.h"
#include "common/micro_batch_tree.h"
#include "common/shard_plan.h"
#include "server/step_stats.h"

namespace dp {

struct CoordinatorStatus {
  JobConfig config;
  ShardSpec shard;
  uint64_t generation = 0;
  bool holds_previous = false;
  int64_t step = 0;
  int64_t total_steps = 0;  // 0 until the data set size is known
  std::vector<int> registered_ranks;
  std::vector<int> pushed_ranks;  // ranks that pushed a block this step
  std::vector<int> live_ranks;    // registered and not lost
  // Whom the step waits for: the ranks whose block (planned or handed to
  // them) is not in; before a plan, the ranks not live.
  std::vector<int> waits_for;
  // The current step's plan: the block of every rank (empty: none).
  std::vector<Block> plan;
  int micro_batches = 0;  // per step
  ElasticCounts elastic;
  // The rank whose push completed the last step (-1: none yet), and the
  // blocks the last applied step was planned in.
  int last_completed_by = -1;
  int last_plan_blocks = 0;
  // By rank: how many applied steps its push completed, i.e. how often the
  // step waited for that rank last (since the start; for the metrics).
  std::vector<int64_t> completed_by;
  bool done = false;
  bool failed = false;     // Fail was called: the job is over
  float last_loss = 0.0f;  // mean of the ranks' losses of the last step
  bool has_eval = false;
  EvalReport last_eval;
  StepTimes times;
  // How many times Pull encoded the weights into a snapshot: at most once a
  // version, and never for one that only WithCurrentWeights handed out.
  int64_t snapshots = 0;
};

}  // namespace dp

#endif  // DP_SERVER_COORDINATOR_STATUS_H_
