// Job configuration <-> wire form, and the resume compatibility check.
#include "server/job_config.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dp {

void ToProto(const JobConfig& config, dp::v1::JobConfig* out) {
  const Schedule& s = config.schedule;
  out->set_world_size(s.world_size);
  out->set_batch_size(s.batch_size);
  out->set_epochs(s.epochs);
  out->set_lr(config.adam.lr);
  out->set_seed(s.seed);
  out->set_shuffle(s.shuffle);
  out->set_dataset(config.dataset);
  out->set_max_steps(s.max_steps);
  out->set_grad_encoding(static_cast<dp::v1::Encoding>(config.grad_encoding));
  out->set_weight_encoding(
      static_cast<dp::v1::Encoding>(config.weight_encoding));
}

JobConfig FromProto(const dp::v1::JobConfig& c) {
  JobConfig config;
  config.schedule.world_size = c.world_size();
  config.schedule.batch_size = c.batch_size();
  config.schedule.epochs = c.epochs();
  config.schedule.seed = c.seed();
  config.schedule.shuffle = c.shuffle();
  config.schedule.max_steps = c.max_steps();
  config.dataset = c.dataset();
  config.adam.lr = c.lr();
  config.grad_encoding = static_cast<Encoding>(c.grad_encoding());
  config.weight_encoding = static_cast<Encoding>(c.weight_encoding());
  return config;
}

absl::Status CheckResumable(const JobConfig& saved, const JobConfig& wanted) {
  std::vector<std::string> diffs;
  auto check = [&diffs](const char* flag, const auto& was, const auto& now) {
    if (!(was == now)) {
      diffs.push_back(absl::StrCat("--", flag, "=", now, " (saved: ", was, ")"));
    }
  };
  check("workers", saved.schedule.world_size, wanted.schedule.world_size);
  check("batch_size", saved.schedule.batch_size, wanted.schedule.batch_size);
  check("seed", saved.schedule.seed, wanted.schedule.seed);
  check("shuffle", saved.schedule.shuffle, wanted.schedule.shuffle);
  check("dataset", saved.dataset, wanted.dataset);
  check("lr", saved.adam.lr, wanted.adam.lr);
  check("grad_encoding", EncodingName(saved.grad_encoding),
        std::string(EncodingName(wanted.grad_encoding)));
  check("weight_encoding", EncodingName(saved.weight_encoding),
        std::string(EncodingName(wanted.weight_encoding)));
  if (diffs.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the checkpoint was written by a different job: ",
                   absl::StrJoin(diffs, ", ")));
}

}  // namespace dp
