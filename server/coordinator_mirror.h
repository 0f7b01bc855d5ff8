// For tests: a copy of everything a request can change in a
// StepCoordinator (StepCoordinator::Observe), leases and waiters included,
// and what differs between two such copies: what "a rejected request
// changes nothing" is checked against. Not for the programs.
#ifndef DP_SERVER_COORDINATOR_MIRROR_H_
#define DP_SERVER_COORDINATOR_MIRROR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/dataset.h"
#include "common/job_config.h"
#include "common/micro_batch_tree.h"
#include "server/step_coordinator.h"

namespace dp {

struct CoordinatorMirror {
  TrainingState training;
  JobConfig config;
  std::optional<DataFingerprint> data;
  std::vector<bool> registered;
  std::vector<bool> received;  // pushed a block this step
  // The sums of the step's blocks that are in, by block.
  std::vector<std::pair<Block, std::vector<float>>> sums;
  std::vector<float> losses;  // by block, as sums
  std::vector<Block> plan;
  std::vector<Block> work;
  std::vector<bool> lost;
  // By rank: who holds it (worker_id), its registration's session, and
  // whether that one's connection closed.
  std::vector<std::string> holders;
  std::vector<uint64_t> sessions;
  std::vector<bool> attended;  // an Attend call of the rank came
  std::vector<bool> closed;
  std::vector<absl::Time> last_seen;  // the leases
  std::vector<bool> told;             // of the failure
  std::vector<bool> reported_missing;
  std::vector<bool> reported_unregistered;
  std::vector<bool> stragglers;
  std::vector<Block> backed_up;  // late blocks handed again this step
  int backups_this_step = 0;
  std::vector<std::pair<int, int64_t>> waiters;  // (rank, step), oldest first
  bool has_eval = false;
  bool final_eval = false;
  EvalReport last_eval;
  bool shutdown = false;
  absl::Status failed;
};

// The names of the fields of `a` and `b` that differ, comma-separated;
// empty when they are the same (floats compared bit by bit).
std::string ObservableDifferences(const CoordinatorMirror& a,
                                  const CoordinatorMirror& b);

}  // namespace dp

#endif  // DP_SERVER_COORDINATOR_MIRROR_H_
