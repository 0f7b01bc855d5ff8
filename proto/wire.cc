// Plain types <-> dp.v1 messages.
#include "proto/wire.h"

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
  out->set_lr(config.adam.lr);
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
  config.adam.lr = c.lr();
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

}  // namespace dp
