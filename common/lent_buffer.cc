// Leases with release/acquire ordering over shared memory of messages.
#include "common/lent_buffer.h"

namespace dp {

LentBuffer::LentBuffer(size_t bytes) : state_(std::make_shared<State>(bytes)) {}

std::shared_ptr<const void> LentBuffer::Lend() const {
  // Relaxed: the caller hands the lease to gRPC after this, in program order.
  state_->leases.fetch_add(1, std::memory_order_relaxed);
  return std::shared_ptr<const void>(
      state_->bytes.data(), [state = state_](const void*) {
        state->leases.fetch_sub(1, std::memory_order_release);
      });
}

bool LentBuffer::InUse() const {
  return state_->leases.load(std::memory_order_acquire) > 0;
}

LentBuffer& LentBufferPool::Free() {
  for (auto& b : buffers_) {
    if (!b->InUse()) return *b;
  }
  buffers_.push_back(std::make_unique<LentBuffer>(bytes_));
  return *buffers_.back();
}

}  // namespace dp
