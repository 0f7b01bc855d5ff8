// JobPlan <-> dp.v1.JobConfig.
#include "common/job_plan.h"

#include "proto/dp.pb.h"

namespace dp {

void PlanToProto(const JobPlan& plan, dp::v1::JobConfig* out) {
  const Schedule& s = plan.schedule;
  out->set_world_size(s.world_size);
  out->set_batch_size(s.batch_size);
  out->set_epochs(s.epochs);
  out->set_seed(s.seed);
  out->set_shuffle(s.shuffle);
  out->set_max_steps(s.max_steps);
  out->set_dataset(plan.dataset);
  out->set_grad_encoding(static_cast<dp::v1::Encoding>(plan.grad_encoding));
  out->set_weight_encoding(static_cast<dp::v1::Encoding>(plan.weight_encoding));
}

JobPlan PlanFromProto(const dp::v1::JobConfig& c) {
  JobPlan plan;
  plan.schedule.world_size = c.world_size();
  plan.schedule.batch_size = c.batch_size();
  plan.schedule.epochs = c.epochs();
  plan.schedule.seed = c.seed();
  plan.schedule.shuffle = c.shuffle();
  plan.schedule.max_steps = c.max_steps();
  plan.dataset = c.dataset();
  plan.grad_encoding = static_cast<Encoding>(c.grad_encoding());
  plan.weight_encoding = static_cast<Encoding>(c.weight_encoding());
  return plan;
}

}  // namespace dp
