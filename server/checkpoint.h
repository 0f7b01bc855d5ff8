// dp-ps's checkpoint directory: files in proto/checkpoint_format.h's format,
// written atomically (temporary file, fsync, rename, fsync of the
// directory), the newest `keep` of the job's current history kept (a
// rollback abandons those past its step), the newest valid one loaded at
// start;
// and whether a saved job may resume under the flags given now.
#ifndef DP_SERVER_CHECKPOINT_H_
#define DP_SERVER_CHECKPOINT_H_

#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/dataset.h"
#include "common/job_config.h"
#include "common/model_layout.h"
#include "proto/checkpoint_format.h"

namespace dp {

// The optimiser's settings that differ between a job saved with `saved` and
// one resumed under `wanted`, each as "--flag=now (saved: was)": --optimizer,
// --lr, the betas, --eps, --weight_decay, the schedule (and those of its
// settings that the old or new schedule reads), --clip_grad_norm, and, for
// a cosine schedule with both schedules' num_samples known, the job's total
// steps (its T). Empty when none differ.
std::vector<std::string> HyperparameterChanges(const JobConfig& saved,
                                               const JobConfig& wanted);

// OK when a job saved with `saved` can resume under `wanted`: everything that
// shapes the computation must match; epochs and max_steps may change, since
// the data order of an epoch does not depend on them. FAILED_PRECONDITION
// naming every differing setting otherwise: first those of the job ("a
// different job"), then, unless allow_hyperparameter_change, those of
// HyperparameterChanges.
absl::Status CheckResumable(const JobConfig& saved, const JobConfig& wanted,
                            bool allow_hyperparameter_change = false);

// "ckpt-000000000123.dpckpt" for step 123: names sort by step.
std::string CheckpointFileName(int64_t step);

class CheckpointStore {
 public:
  // Checkpoints of shard `shard_index` of `shard_count` (one dp-ps: 0, 1).
  CheckpointStore(std::string dir, ModelLayout layout, int keep,
                  int shard_index = 0, int shard_count = 1);
  ~CheckpointStore();  // finishes a pending write

  // Creates the directory if needed and proves it writable with a probe
  // file, then verifies the checkpoints in it. Errors name the directory.
  [[nodiscard]] absl::Status Open();

  // The newest checkpoint that verifies, or nullopt when there is none.
  // Every file skipped is logged with its reason. It may be another shard's
  // (the caller refuses it).
  std::optional<Checkpoint> LoadNewest() const;
  // FAILED_PRECONDITION naming the file when the newest checkpoint that is
  // not damaged holds another model than the store's (another --layers):
  // LoadNewest would skip it, and the job started afresh would then remove
  // it. OK otherwise.
  [[nodiscard]] absl::Status CheckSameModel() const;

  // Sharded jobs roll back to a step every shard can restore.
  // The steps of the checkpoints of shard `shard_index` of `shard_count`
  // that verified when the store opened or were written since, oldest
  // first.
  std::vector<int64_t> RestorableSteps() const;
  // The checkpoint of `step`, verified; NOT_FOUND or DATA_LOSS saying why.
  absl::StatusOr<Checkpoint> Load(int64_t step) const;

  // Writes now, then removes those past c's step (left by a rollback, see
  // Rewind) and all but the newest `keep`. On error the files already there
  // are untouched, and the error is counted in failures(). Writes of one
  // store - this, and the background writer's - run one at a time: the
  // final checkpoint may write the step whose WriteAsync is still in
  // progress.
  [[nodiscard]] absl::Status Write(const Checkpoint& c);

  // The job went back to `step` (a rollback) and is now in `history` (the
  // coordinator's generation): every checkpoint past it - on disk, being
  // written or waiting - belongs to a history that no longer exists. They
  // are removed, so that neither retention nor LoadNewest nor
  // RestorableSteps prefers them to the history the job is in, and a
  // checkpoint of another history handed in later is not written.
  void Rewind(int64_t step, uint64_t history);

  // Hands the checkpoint to a background writer so training does not wait
  // for the disk. One may wait while another is written; a third blocks the
  // caller until the writer takes the waiting one, so that every step handed
  // in is written: the shards of a job then hold checkpoints of the same
  // steps, which a rollback needs, however slow each one's disk. Errors are
  // logged, and counted in failures(). `history` is the coordinator's
  // generation when the state was taken: after a Rewind, only the
  // checkpoints of the history it named are written.
  void WriteAsync(Checkpoint c, uint64_t history);
  // Blocks until the background writer is idle.
  void Flush();
  // Writes that failed since the store was made, Write's and the
  // background writer's.
  int64_t failures() const;
  // The step of the newest checkpoint on disk (the last of
  // RestorableSteps): the one a restart resumes from. 0 when there is none,
  // as a restart then begins at step 0.
  int64_t NewestStep() const;
  const std::string& dir() const { return dir_; }

 private:
  void WriterLoop();
  absl::Status WriteLocked(const Checkpoint& c)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Removes the checkpoints past `step`, on disk and in verified_.
  void RemoveAfterLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  std::vector<std::pair<int64_t, std::string>> ListNewestFirst() const;

  const std::string dir_;
  const ModelLayout layout_;
  const int keep_;
  const int shard_index_;
  const int shard_count_;
  // Held for a whole Write: serialises the file and the retention pass.
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::optional<Checkpoint> queued_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<int64_t> verified_ ABSL_GUARDED_BY(mu_);
  // The history of the last Rewind; none before the first.
  std::optional<uint64_t> history_ ABSL_GUARDED_BY(mu_);
  int64_t rewound_to_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread writer_;
};

}  // namespace dp

#endif  // DP_SERVER_CHECKPOINT_H_
