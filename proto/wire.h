// The one place the plain types of a job meet their dp.v1 messages: each
// conversion is written once, for the service, the client, shard 0's
// collection and the checkpoint format alike.
#ifndef DP_PROTO_WIRE_H_
#define DP_PROTO_WIRE_H_

#include "common/job_config.h"
#include "common/micro_batch_tree.h"
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

}  // namespace dp

#endif  // DP_PROTO_WIRE_H_
