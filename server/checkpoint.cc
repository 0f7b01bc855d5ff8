// Checkpoint files: atomic writes, retention, the newest valid one, and the
// resume check.
#include "server/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/log.h"
#include "server/lr_schedule.h"

namespace dp {
namespace {

constexpr char kPrefix[] = "ckpt-";
constexpr char kSuffix[] = ".dpckpt";

// "--flag=now (saved: was)" for each setting that differs, in the order
// checked.
class Differences {
 public:
  template <typename T>
  void Check(const char* flag, const T& was, const T& now) {
    if (!(was == now)) {
      list_.push_back(
          absl::StrCat("--", flag, "=", now, " (saved: ", was, ")"));
    }
  }
  std::vector<std::string> Take() { return std::move(list_); }

 private:
  std::vector<std::string> list_;
};

}  // namespace

std::string CheckpointFileName(int64_t step) {
  return absl::StrFormat("%s%012d%s", kPrefix, step, kSuffix);
}

std::vector<std::string> HyperparameterChanges(const JobConfig& saved,
                                               const JobConfig& wanted) {
  const AdamOptions& was = saved.adam;
  const AdamOptions& now = wanted.adam;
  auto optimizer = [](const AdamOptions& o) {
    return std::string(o.decoupled_weight_decay ? "adamw" : "adam");
  };
  auto schedule = [](const AdamOptions& o) {
    return std::string(LrScheduleName(o.schedule.kind));
  };
  auto uses = [&](LrScheduleKind kind) {
    return was.schedule.kind == kind || now.schedule.kind == kind;
  };
  Differences d;
  d.Check("optimizer", optimizer(was), optimizer(now));
  d.Check("lr", was.lr, now.lr);
  d.Check("beta1", was.beta1, now.beta1);
  d.Check("beta2", was.beta2, now.beta2);
  d.Check("eps", was.eps, now.eps);
  d.Check("weight_decay", was.weight_decay, now.weight_decay);
  d.Check("lr_schedule", schedule(was), schedule(now));
  d.Check("warmup_steps", was.schedule.warmup_steps, now.schedule.warmup_steps);
  // A schedule's own settings count only where a schedule reads them.
  if (uses(LrScheduleKind::kCosine)) {
    d.Check("lr_min", was.schedule.lr_min, now.schedule.lr_min);
  }
  if (uses(LrScheduleKind::kStep)) {
    d.Check("lr_step_every", was.schedule.step_every, now.schedule.step_every);
    d.Check("lr_gamma", was.schedule.gamma, now.schedule.gamma);
  }
  d.Check("clip_grad_norm", was.clip_grad_norm, now.clip_grad_norm);
  // Cosine's curve spans the job: another length is another rate at every
  // step to come. Known only once the data set's length is.
  if (was.schedule.kind == LrScheduleKind::kCosine &&
      now.schedule.kind == LrScheduleKind::kCosine &&
      saved.schedule.num_samples > 0 && wanted.schedule.num_samples > 0) {
    d.Check("epochs/--max_steps: the cosine schedule's total steps",
            saved.schedule.total_steps(), wanted.schedule.total_steps());
  }
  return d.Take();
}

absl::Status CheckResumable(const JobConfig& saved, const JobConfig& wanted,
                            bool allow_hyperparameter_change) {
  // The mathematics of a step: how many workers compute it does not matter.
  Differences d;
  d.Check("global_batch", saved.schedule.global_batch(),
          wanted.schedule.global_batch());
  d.Check("micro_batch", saved.schedule.batch_size, wanted.schedule.batch_size);
  d.Check("seed", saved.schedule.seed, wanted.schedule.seed);
  d.Check("shuffle", saved.schedule.shuffle, wanted.schedule.shuffle);
  d.Check("dataset", saved.dataset, wanted.dataset);
  d.Check("grad_encoding", std::string(EncodingName(saved.grad_encoding)),
          std::string(EncodingName(wanted.grad_encoding)));
  d.Check("weight_encoding", std::string(EncodingName(saved.weight_encoding)),
          std::string(EncodingName(wanted.weight_encoding)));
  std::vector<std::string> job = d.Take();
  std::vector<std::string> optimiser =
      allow_hyperparameter_change ? std::vector<std::string>()
                                  : HyperparameterChanges(saved, wanted);
  if (!job.empty()) {
    // Every difference, so that one attempt shows all there are to undo.
    job.insert(job.end(), optimiser.begin(), optimiser.end());
    return absl::FailedPreconditionError(
        absl::StrCat("the checkpoint was written by a different job: ",
                     absl::StrJoin(job, ", ")));
  }
  if (optimiser.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the checkpoint was written with other optimiser settings: ",
      absl::StrJoin(optimiser, ", "),
      " (--allow_hyperparameter_change resumes with the new ones)"));
}

CheckpointStore::CheckpointStore(std::string dir, ModelLayout layout, int keep,
                                 int shard_index, int shard_count)
    : dir_(std::move(dir)),
      layout_(std::move(layout)),
      keep_(std::max(1, keep)),
      shard_index_(shard_index),
      shard_count_(shard_count) {
  writer_ = std::thread([this] { WriterLoop(); });
}

CheckpointStore::~CheckpointStore() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  writer_.join();
}

absl::Status CheckpointStore::Open() {
  if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot create checkpoint directory %s: %s", dir_,
                        std::strerror(errno)));
  }
  struct stat st;
  if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("checkpoint directory %s is not a directory", dir_));
  }
  const std::string probe = dir_ + "/.write-probe";
  if (absl::Status s = WriteFileAtomic(probe, "probe"); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint directory %s is not writable: %s", dir_, s.message()));
  }
  ::unlink(probe.c_str());
  for (const auto& [step, path] : ListNewestFirst()) {
    if (Load(step).ok()) {
      absl::MutexLock lock(&mu_);
      verified_.insert(step);
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> CheckpointStore::RestorableSteps() const {
  absl::MutexLock lock(&mu_);
  return std::vector<int64_t>(verified_.begin(), verified_.end());
}

absl::StatusOr<Checkpoint> CheckpointStore::Load(int64_t step) const {
  const std::string path = dir_ + "/" + CheckpointFileName(step);
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<Checkpoint> c = DecodeCheckpoint(layout_, *bytes);
  if (!c.ok()) {
    return absl::Status(c.status().code(),
                        absl::StrCat(path, ": ", c.status().message()));
  }
  if (c->state.step != step) {
    return absl::DataLossError(
        absl::StrFormat("%s holds step %d", path, c->state.step));
  }
  if (c->shard_index != shard_index_ || c->shard_count != shard_count_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s holds shard %d of %d, not shard %d of %d", path, c->shard_index,
        c->shard_count, shard_index_, shard_count_));
  }
  return c;
}

std::vector<std::pair<int64_t, std::string>> CheckpointStore::ListNewestFirst()
    const {
  std::vector<std::pair<int64_t, std::string>> files;
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return files;
  while (struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    absl::string_view number = name;
    int64_t step;
    if (absl::ConsumePrefix(&number, kPrefix) &&
        absl::ConsumeSuffix(&number, kSuffix) &&
        absl::SimpleAtoi(number, &step)) {
      files.emplace_back(step, dir_ + "/" + name);
    }
  }
  ::closedir(d);
  std::sort(files.rbegin(), files.rend());
  return files;
}

absl::Status CheckpointStore::CheckSameModel() const {
  for (const auto& [step, path] : ListNewestFirst()) {
    absl::StatusOr<std::string> bytes = ReadFile(path);
    if (!bytes.ok()) continue;
    // DecodeCheckpoint says FAILED_PRECONDITION only of another model.
    const absl::Status s = DecodeCheckpoint(layout_, *bytes).status();
    if (s.code() == absl::StatusCode::kFailedPrecondition) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: %s (another --layers or --init_model?); use another --checkpoint_dir, or "
          "remove the checkpoints to start afresh",
          path, s.message()));
    }
    if (s.ok()) return absl::OkStatus();
  }
  return absl::OkStatus();
}

std::optional<Checkpoint> CheckpointStore::LoadNewest() const {
  for (const auto& [step, path] : ListNewestFirst()) {
    auto bytes = ReadFile(path);
    if (!bytes.ok()) {
      Log("skipping checkpoint %s: %s", path, bytes.status().message());
      continue;
    }
    auto c = DecodeCheckpoint(layout_, *bytes);
    if (!c.ok()) {
      Log("skipping checkpoint %s: %s", path, c.status().message());
      continue;
    }
    if (c->state.step != step) {
      Log("skipping checkpoint %s: it holds step %d", path, c->state.step);
      continue;
    }
    return std::move(*c);
  }
  return std::nullopt;
}

absl::Status CheckpointStore::Write(const Checkpoint& c) {
  absl::MutexLock write_lock(&write_mu_);
  absl::Status s = WriteLocked(c);
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    ++failures_;
  }
  return s;
}

absl::Status CheckpointStore::WriteLocked(const Checkpoint& c) {
  const std::string path = dir_ + "/" + CheckpointFileName(c.state.step);
  if (absl::Status s = WriteFileAtomic(path, EncodeCheckpoint(layout_, c));
      !s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("cannot write checkpoint of "
                                                  "step %d: %s",
                                                  c.state.step, s.message()));
  }
  // Retention only after the new file is safely in place. Checkpoints of
  // one history come in step order, so any past this one were left by a
  // rollback (one handed in while the shard rewound, say): they go first,
  // whatever `keep` says.
  RemoveAfterLocked(c.state.step);
  auto files = ListNewestFirst();
  absl::MutexLock lock(&mu_);
  verified_.insert(c.state.step);
  for (size_t i = keep_; i < files.size(); ++i) {
    verified_.erase(files[i].first);
    ::unlink(files[i].second.c_str());
  }
  return absl::OkStatus();
}

void CheckpointStore::RemoveAfterLocked(int64_t step) {
  std::vector<std::string> removed;
  for (const auto& [file_step, path] : ListNewestFirst()) {
    if (file_step <= step) break;
    ::unlink(path.c_str());
    removed.push_back(absl::StrCat(file_step));
  }
  {
    absl::MutexLock lock(&mu_);
    verified_.erase(verified_.upper_bound(step), verified_.end());
  }
  if (!removed.empty()) {
    Log("removed the checkpoints of step%s %s: the job went back to step %d",
        removed.size() == 1 ? "" : "s", absl::StrJoin(removed, ", "), step);
  }
}

void CheckpointStore::Rewind(int64_t step, uint64_t history) {
  // With write_mu_ held no write is in progress, and the writer takes a
  // waiting checkpoint only under it: none of the abandoned history can
  // land on disk after the removal.
  absl::MutexLock write_lock(&write_mu_);
  {
    absl::MutexLock lock(&mu_);
    history_ = history;
    rewound_to_ = step;
    if (queued_.has_value() && queued_->state.step > step) {
      Log("dropped the checkpoint of step %d waiting to be written: the job "
          "went back to step %d",
          queued_->state.step, step);
      queued_.reset();
    }
  }
  RemoveAfterLocked(step);
}

void CheckpointStore::WriteAsync(Checkpoint c, uint64_t history) {
  absl::MutexLock lock(&mu_);
  auto slot_free = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !queued_.has_value();
  };
  mu_.Await(absl::Condition(&slot_free));
  // After the wait, which released the lock: a Rewind may have come since.
  if (history_.has_value() && history != *history_) {
    Log("dropped the checkpoint of step %d: it was taken before the job went "
        "back to step %d",
        c.state.step, rewound_to_);
    return;
  }
  queued_ = std::move(c);
}

void CheckpointStore::Flush() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !queued_.has_value() && !writing_;
  };
  mu_.Await(absl::Condition(&idle));
}

int64_t CheckpointStore::failures() const {
  absl::MutexLock lock(&mu_);
  return failures_;
}

int64_t CheckpointStore::NewestStep() const {
  absl::MutexLock lock(&mu_);
  return verified_.empty() ? 0 : *verified_.rbegin();
}

void CheckpointStore::WriterLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return queued_.has_value() || stop_;
      };
      mu_.Await(absl::Condition(&ready));
      if (!queued_.has_value()) return;  // stopping, nothing left
    }
    // The checkpoint is taken under write_mu_, so that Rewind sees it
    // either waiting (and drops it) or written (and removes it).
    absl::MutexLock write_lock(&write_mu_);
    Checkpoint c;
    {
      absl::MutexLock lock(&mu_);
      if (!queued_.has_value()) continue;  // dropped by a Rewind
      c = std::move(*queued_);
      queued_.reset();
      writing_ = true;
    }
    absl::Status s = WriteLocked(c);
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!s.ok()) {
      ++failures_;
      Log("error: %s; training goes on, the last good checkpoint stays",
          s.message());
    }
  }
}

}  // namespace dp
