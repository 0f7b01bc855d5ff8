// The split of the parameter vector over dp-ps shards.
#include "common/shard_plan.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dp {

ShardSpec ShardSpec::OrWhole(int64_t num_params) const {
  if (count > 1) return *this;
  return ShardSpec{0, 1, ParamRange{0, num_params}};
}

std::string ShardSpec::ToString() const {
  return absl::StrFormat("shard %d of %d [%d, %d)", index, count, range.offset,
                         range.end());
}

std::vector<ParamRange> ShardRanges(const ModelLayout& layout, int shards) {
  const int64_t n = layout.num_params();
  const int64_t share = n / std::max(shards, 1);
  std::vector<int64_t> cuts = {0};
  for (int k = 1; k < shards; ++k) {
    const int64_t ideal = n * k / shards;
    int64_t cut = ideal / 16 * 16;
    int64_t nearest = -1;
    for (const TensorInfo& t : layout.tensors()) {
      const int64_t b = t.offset;  // a tensor's start is a boundary
      if (b > cuts.back() && (nearest < 0 || std::llabs(b - ideal) <
                                                 std::llabs(nearest - ideal))) {
        nearest = b;
      }
    }
    if (nearest >= 0 && std::llabs(nearest - ideal) * 50 <= share) {
      cut = nearest;
    }
    cut = std::clamp(cut, cuts.back(), n);
    cuts.push_back(cut);
  }
  cuts.push_back(n);
  std::vector<ParamRange> ranges;
  for (int k = 0; k < shards; ++k) {
    ranges.push_back(ParamRange{cuts[k], cuts[k + 1] - cuts[k]});
  }
  return ranges;
}

ParamRange WholeTensors(const ModelLayout& layout, ParamRange range) {
  // Tensors are contiguous and in order: those inside are one run of them.
  int64_t begin = -1, end = -1;
  for (const TensorInfo& t : layout.tensors()) {
    if (t.offset < range.offset || t.offset + t.size > range.end()) continue;
    if (begin < 0) begin = t.offset;
    end = t.offset + t.size;
  }
  if (begin < 0) return ParamRange{range.offset, 0};
  return ParamRange{begin, end - begin};
}

absl::Status MakeShardSpec(const ModelLayout& layout, int count, int index,
                           ShardSpec* spec) {
  if (count < 1 || count > kMaxShards) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--shards=%d is out of range [1, %d]", count, kMaxShards));
  }
  if (index < 0 || index >= count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--shard=%d is out of range: with --shards=%d it is 0..%d", index,
        count, count - 1));
  }
  const std::vector<ParamRange> ranges = ShardRanges(layout, count);
  if (ranges[index].length == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--shards=%d leaves shard %d no parameters: the model has %d", count,
        index, layout.num_params()));
  }
  spec->index = index;
  spec->count = count;
  spec->range = ranges[index];
  return absl::OkStatus();
}

absl::Status CheckShardAddresses(int count, int index, size_t addresses) {
  if (count > 1 && index == 0 && addresses == 0) {
    return absl::InvalidArgumentError(
        "shard 0 of a sharded job needs --shard_addresses (the other "
        "shards' host:port) to collect the model at the end");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ExpandShardTemplate(
    absl::string_view list, int shards) {
  constexpr absl::string_view kShard = "{shard}";
  std::vector<std::string> out;
  for (absl::string_view entry :
       absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    if (!absl::StrContains(entry, kShard)) {
      out.emplace_back(entry);
      continue;
    }
    if (shards < 1 || shards > kMaxShards) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "'%s' names each shard by {shard}: it needs the shard count "
          "(--shards, DP_SHARDS) in 1..%d, got %d",
          entry, kMaxShards, shards));
    }
    for (int k = 0; k < shards; ++k) {
      out.push_back(absl::StrReplaceAll(entry, {{kShard, absl::StrCat(k)}}));
    }
  }
  return out;
}

}  // namespace dp
