// The one place the plain types of a job meet their dp.v1 messages: each
// conversion is written once, for the service, the client, shard 0's
// collection and the checkpoint format alike.
#ifndef DP_PROTO_WIRE_H_
#define DP_PROTO_WIRE_H_

#include "common/job_config.h"
#include "common/micro_batch_tree.h"
#include "common/shard_plan.h"
#include "common/tensor_codec.h"
#include "proto/dp.pb.h"

namespace dp {

// The two enums share their values (proto/dp.proto lists them so).
dp::v1::Encoding ToProto(Encoding encoding);
Encoding FromProto(dp::v1::Encoding encoding);

// The configuration <-> dp.v1.JobConfig (the Adam options but lr are not
// on the wire).
void ToProto(const JobConfig& config, dp::v1::JobConfig* out);
JobConfig FromProto(const dp::v1::JobConfig& config);
// A block of micro-batches <-> dp.v1.Block (an empty block is the default,
// absent message).
void ToProto(const Block& block, dp::v1::Block* out);
Block FromProto(const dp::v1::Block& block);
// A shard's account of itself <-> dp.v1.ShardInfo (the step travels
// beside it). A dp-ps that says nothing of shards holds the whole vector of
// `num_params`.
void ToProto(const ShardState& shard, dp::v1::ShardInfo* out);
ShardState FromProto(const dp::v1::ShardInfo& info, int64_t step,
                     int64_t num_params);
// An evaluation report <-> dp.v1.ReportEvalRequest (the rank travels
// beside it).
void ToProto(const EvalReport& report, dp::v1::ReportEvalRequest* out);
EvalReport FromProto(const dp::v1::ReportEvalRequest& request);

}  // namespace dp

#endif  // DP_PROTO_WIRE_H_
