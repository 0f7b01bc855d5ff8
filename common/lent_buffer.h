// Memory that gRPC messages send from without a copy (a worker's gradient,
// dp-ps's weights snapshot), and the one safe way to know when it may be
// written again. Every message that sends the memory holds a lease
// (SerializeWithTensor's owner). gRPC drops the lease on whatever thread
// frees the slice; that drop is a release-store and InUse() an acquire-load,
// so a buffer seen free has no reader left, and every read gRPC made of it
// happened before the caller's next write.
#ifndef DP_COMMON_LENT_BUFFER_H_
#define DP_COMMON_LENT_BUFFER_H_

#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"

namespace dp {

class LentBuffer {
 public:
  explicit LentBuffer(size_t bytes);

  char* data() { return state_->bytes.data(); }
  const char* data() const { return state_->bytes.data(); }
  size_t size() const { return state_->bytes.size(); }
  absl::string_view view() const { return {data(), size()}; }

  // A lease for one message: keeps the memory alive (even past this object)
  // and InUse() true until the last copy of it is destroyed.
  std::shared_ptr<const void> Lend() const;
  // True while a lease is held. Never write the buffer while it is.
  bool InUse() const;

 private:
  struct State {
    explicit State(size_t bytes) : bytes(bytes) {}
    std::vector<char> bytes;
    std::atomic<int> leases{0};
  };
  std::shared_ptr<State> state_;
};

// Buffers of one size: Free() hands out one that no message holds, and grows
// the pool while gRPC still holds all of them (in steady state it does not).
class LentBufferPool {
 public:
  explicit LentBufferPool(size_t bytes) : bytes_(bytes) {}
  LentBuffer& Free();
  size_t allocated() const { return buffers_.size(); }

 private:
  size_t bytes_;
  std::vector<std::unique_ptr<LentBuffer>> buffers_;
};

}  // namespace dp

#endif  // DP_COMMON_LENT_BUFFER_H_
