// How the flat parameter vector is split over S dp-ps shards: shard K owns
// one contiguous range, with its Adam state, and runs the step protocol for
// that range alone. Adam is elementwise and every shard applies the same
// step t, so S shards compute bitwise the model one dp-ps computes.
#ifndef DP_COMMON_SHARD_PLAN_H_
#define DP_COMMON_SHARD_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model_layout.h"

namespace dp {

inline constexpr int kMaxShards = 64;

// A contiguous range of the flat parameter vector, in floats.
struct ParamRange {
  int64_t offset = 0;
  int64_t length = 0;
  int64_t end() const { return offset + length; }
  bool operator==(const ParamRange& o) const {
    return offset == o.offset && length == o.length;
  }
};

// One shard of a job: its place among the shards and the range it owns.
struct ShardSpec {
  int index = 0;
  int count = 1;
  ParamRange range;
  std::string ToString() const;  // "shard 1 of 2 [117568, 235146)"
  // This shard, or (count <= 1) shard 0 of 1 holding all `num_params`.
  ShardSpec OrWhole(int64_t num_params) const;
};

// What a shard says of itself (GetStatus, Register, Rollback).
struct ShardState {
  ShardSpec spec;  // one dp-ps: shard 0 of 1, the whole vector
  int64_t step = 0;
  uint64_t generation = 0;      // new at every start and rollback of the shard
  bool holds_previous = false;  // it can serve version step - 1 too
  std::vector<int64_t> restorable_steps;  // 0 and its verified checkpoints
};

// The ranges of `shards` shards over `layout`, in shard order, contiguous,
// covering the vector. Balanced by bytes: each cut is at k * n / S, moved to
// a tensor boundary when one lies within 2% of a shard's share (a shard
// then holds whole tensors), else to a multiple of 16 floats (64 bytes, so
// that no two shards' update loops share a cache line).
std::vector<ParamRange> ShardRanges(const ModelLayout& layout, int shards);

// The part of `range` that the tensors of `layout` lying wholly inside it
// fill (a tensor cut by the range's ends is not in it): what a worker may
// read in place from the shard that owns `range`. Empty (length 0) when no
// tensor lies wholly inside.
ParamRange WholeTensors(const ModelLayout& layout, ParamRange range);

// The spec of shard `index` of `count`; INVALID_ARGUMENT naming the flags
// when the pair is out of range.
absl::Status MakeShardSpec(const ModelLayout& layout, int count, int index,
                           ShardSpec* spec);

// INVALID_ARGUMENT when shard `index` of `count` has no other shards'
// addresses but needs them: shard 0 of a sharded job collects the model.
absl::Status CheckShardAddresses(int count, int index, size_t addresses);

// A comma-separated list of addresses in which an entry holding "{shard}"
// stands for `shards` entries, with 0..shards-1 in its place:
// "dp-ps-{shard}.dp-ps:5000" and 3 shards name the 3 pods of a StatefulSet,
// so that the shard count is written in one place. INVALID_ARGUMENT for a
// template without a shard count (shards < 1).
absl::StatusOr<std::vector<std::string>> ExpandShardTemplate(
    absl::string_view list, int shards);

}  // namespace dp

#endif  // DP_COMMON_SHARD_PLAN_H_
