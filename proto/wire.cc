// Plain types <-> dp.v1 messages.
#include "proto/wire.h"

#include <algorithm>

namespace dp {

dp::v1::Encoding ToProto(Encoding encoding) {
  return static_cast<dp::v1::Encoding>(encoding);
}

Encoding FromProto(dp::v1::Encoding encoding) {
  return static_cast<Encoding>(encoding);
}

void ToProto(const JobConfig& config, dp::v1::JobConfig* out) {
  const Schedule& s = config.schedule;
  out->set_world_size(s.world_size);
  out->set_batch_size(s.batch_size);
  out->set_micro_batches(s.micro_batches);
  out->set_min_workers(config.min_workers);
  out->set_epochs(s.epochs);
  out->set_seed(s.seed);
  out->set_shuffle(s.shuffle);
  out->set_max_steps(s.max_steps);
  out->set_dataset(config.dataset);
  // Every job's tensors, an MLP's too, for workers that compute any model;
  // widths only for an MLP, so that one of them is not read as another.
  if (config.tensors.empty()) {
    for (int width : config.layers) out->add_layers(width);
  }
  if (absl::StatusOr<ModelLayout> layout = LayoutOfJob(config, "the model");
      layout.ok()) {
    for (const TensorInfo& t : layout->tensors()) {
      dp::v1::TensorSpec* spec = out->add_tensors();
      spec->set_name(t.name);
      for (int64_t d : t.shape) spec->add_shape(d);
    }
    out->set_model_fingerprint(layout->Fingerprint());
  }
  out->set_lr(config.adam.lr);
  const AdamOptions& adam = config.adam;
  dp::v1::Optimizer* optimizer = out->mutable_optimizer();
  optimizer->set_adamw(adam.decoupled_weight_decay);
  optimizer->set_beta1(adam.beta1);
  optimizer->set_beta2(adam.beta2);
  optimizer->set_eps(adam.eps);
  optimizer->set_weight_decay(adam.weight_decay);
  optimizer->set_lr_schedule(
      static_cast<dp::v1::LrSchedule>(adam.schedule.kind));
  optimizer->set_warmup_steps(adam.schedule.warmup_steps);
  optimizer->set_lr_min(adam.schedule.lr_min);
  optimizer->set_lr_step_every(adam.schedule.step_every);
  optimizer->set_lr_gamma(adam.schedule.gamma);
  optimizer->set_clip_grad_norm(adam.clip_grad_norm);
  out->set_grad_encoding(ToProto(config.grad_encoding));
  out->set_weight_encoding(ToProto(config.weight_encoding));
}

JobConfig FromProto(const dp::v1::JobConfig& c) {
  JobConfig config;
  config.schedule.world_size = c.world_size();
  config.schedule.batch_size = c.batch_size();
  config.schedule.micro_batches = c.micro_batches();
  config.min_workers = c.min_workers();
  config.schedule.epochs = c.epochs();
  config.schedule.seed = c.seed();
  config.schedule.shuffle = c.shuffle();
  config.schedule.max_steps = c.max_steps();
  config.dataset = c.dataset();
  // A dp-ps that sends no layers trains SimpleNet, JobConfig's default,
  // unless it sends tensors: then the model is those. An MLP's tensors
  // repeat its widths.
  if (c.layers_size() > 0) {
    config.layers.assign(c.layers().begin(), c.layers().end());
  } else if (c.tensors_size() > 0) {
    config.layers.clear();
    for (const dp::v1::TensorSpec& spec : c.tensors()) {
      config.tensors.push_back(
          {spec.name(), {spec.shape().begin(), spec.shape().end()}});
    }
  }
  config.adam.lr = c.lr();
  if (c.has_optimizer()) {
    const dp::v1::Optimizer& o = c.optimizer();
    AdamOptions& adam = config.adam;
    adam.decoupled_weight_decay = o.adamw();
    adam.beta1 = o.beta1();
    adam.beta2 = o.beta2();
    adam.eps = o.eps();
    adam.weight_decay = o.weight_decay();
    adam.schedule.kind = static_cast<LrScheduleKind>(o.lr_schedule());
    adam.schedule.warmup_steps = o.warmup_steps();
    adam.schedule.lr_min = o.lr_min();
    adam.schedule.step_every = o.lr_step_every();
    adam.schedule.gamma = o.lr_gamma();
    adam.clip_grad_norm = o.clip_grad_norm();
  }
  config.grad_encoding = FromProto(c.grad_encoding());
  config.weight_encoding = FromProto(c.weight_encoding());
  return config;
}

void ToProto(const Block& block, dp::v1::Block* out) {
  out->set_first(block.first);
  out->set_count(block.count);
}

Block FromProto(const dp::v1::Block& block) {
  return Block{block.first(), block.count()};
}

void ToProto(const ShardState& shard, dp::v1::ShardInfo* out) {
  out->set_index(shard.spec.index);
  out->set_count(shard.spec.count);
  out->set_offset(shard.spec.range.offset);
  out->set_length(shard.spec.range.length);
  out->set_generation(shard.generation);
  out->set_holds_previous(shard.holds_previous);
  for (int64_t step : shard.restorable_steps) out->add_restorable_steps(step);
}

ShardState FromProto(const dp::v1::ShardInfo& info, int64_t step,
                     int64_t num_params) {
  ShardState s;
  s.spec.index = info.index();
  s.spec.count = std::max(info.count(), 1);
  s.spec.range = info.length() > 0 ? ParamRange{info.offset(), info.length()}
                                   : ParamRange{0, num_params};
  s.step = step;
  s.generation = info.generation();
  s.holds_previous = info.holds_previous();
  s.restorable_steps.assign(info.restorable_steps().begin(),
                            info.restorable_steps().end());
  return s;
}

void ToProto(const EvalReport& report, dp::v1::ReportEvalRequest* out) {
  out->set_step(report.step);
  out->set_epoch(report.epoch);
  out->set_accuracy(report.accuracy);
  out->set_loss(report.loss);
  out->set_num_samples(report.num_samples);
  out->set_final(report.final);
}

EvalReport FromProto(const dp::v1::ReportEvalRequest& r) {
  return EvalReport{r.step(), r.epoch(),       r.accuracy(),
                    r.loss(), r.num_samples(), r.final()};
}

}  // namespace dp
