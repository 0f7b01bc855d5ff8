// Shared memory between dp-ps and the workers on its host, and the handover
// of it. Regions are memfds: they have no name, so nothing is left behind
// when the processes holding them die (kill -9 included), and nothing that
// another user or a later dp-ps could find or trust. They reach an admitted
// worker over a Unix socket in the abstract namespace (so only processes in
// dp-ps's network namespace - its host, or its pod - can connect), for a
// one-time ticket that the worker got from Register over gRPC (mTLS and the
// token apply there), from a peer of the same user.
//
// What a worker holding a region can do to it is bounded by the kernel, not
// by trust: every region's size is sealed (a shrunk region would turn
// dp-ps's next read into SIGBUS), and the weights are sealed against every
// writer but dp-ps's own mapping (a read-only descriptor alone can be
// reopened writable through /proc/self/fd). What a worker writes into its
// own slot it can change at any time: dp-ps reads it once, and decides only
// on its private copy.
#ifndef DP_COMMON_SHARED_MEMORY_H_
#define DP_COMMON_SHARED_MEMORY_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/tensor_codec.h"

namespace dp {

// A mapped memfd.
class SharedRegion {
 public:
  // Who may write a new region once it is handed over.
  enum class Peers {
    kMayWrite,  // a gradient slot: its worker writes, dp-ps reads
    kReadOnly,  // the weights: dp-ps's mapping writes, nobody else can
  };
  // A new region of `bytes`, zeroed, mapped read-write here, its size sealed
  // (no one can shrink or grow it) and, for kReadOnly, sealed against every
  // later writable mapping or write(2). Mode 0600 (0400 for kReadOnly).
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Create(
      const char* name, size_t bytes, Peers peers = Peers::kMayWrite);
  // Maps `fd` (owned from now on), which must hold at least `bytes`.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Map(int fd, size_t bytes,
                                                           bool writable);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }
  // A new read-only descriptor of the same memory: whoever maps it cannot
  // write (mmap with PROT_WRITE fails). The caller closes it.
  absl::StatusOr<int> ReadOnlyDescriptor() const;

 private:
  SharedRegion(int fd, char* data, size_t size)
      : fd_(fd), data_(data), size_(size) {}
  int fd_;
  char* data_;
  size_t size_;
};

// The weights in a region, two versions at a time: version v is written
// into buffer v % 2, each a header (sequence counter, version, encoding,
// number of values) and the encoded values. A worker reads version v while
// it computes step v, and pushes step v after that; dp-ps writes v + 2 into
// the same buffer only after an update that needs this push. So no honest
// publish touches the buffer a worker reads, and a worker may compute from
// it in place; the sequence counter tells it when something did (a second
// process of its rank pushing for it, a shard rolled back).
size_t WeightsRegionBytes(int64_t num_values, Encoding encoding);
// dp-ps: PublishWeights in two halves, for a writer that makes the values
// as it writes them (the update): BeginWeights marks the buffer of version
// `step` as being written and returns where its `num_values` values go,
// encoded as `encoding`; EndWeights(step) makes them the version.
char* BeginWeights(SharedRegion* region, int64_t step, Encoding encoding,
                   int64_t num_values);
void EndWeights(SharedRegion* region, int64_t step);
// dp-ps: writes version `step` of every value, encoded as it is written,
// into its buffer: one pass from dp-ps's parameters, in any encoding.
void PublishWeights(SharedRegion* region, int64_t step, Encoding encoding,
                    absl::Span<const float> values);

// A version of the weights where it lies in the region.
struct SharedWeights {
  int64_t step = 0;
  Encoding encoding = Encoding::kF32;
  const char* values = nullptr;  // num_values encoded values
  int64_t num_values = 0;
  uint64_t seq = 0;  // its buffer's sequence counter when found
};
// A worker: version `step` of `num_values` values, in its buffer. A look
// that meets a publish waits for it. ABORTED when the buffer holds another
// version (dp-ps moved on or back: re-sync) or dp-ps kept rewriting it for
// `patience` (a reader this slow should ask over gRPC); DATA_LOSS for a
// buffer that does not hold what it should.
absl::StatusOr<SharedWeights> FindWeights(
    const SharedRegion& region, int64_t step, int64_t num_values,
    absl::Duration patience = absl::Seconds(2));
// Whether the buffer of `found` still holds it, untouched since
// FindWeights: then every value read from it in between was of that
// version.
bool StillHolds(const SharedRegion& region, const SharedWeights& found);
// Whether `status` is one of FindWeights' ABORTEDs: the weights in shared
// memory moved under this worker's read, and the next read may find the
// version it asks for. An ABORTED from dp-ps itself (a shard behind, a
// rollback) says nothing of the kind: reading again meets it again.
bool IsMovedUnderRead(const absl::Status& status);
// `status` with the same mark: another ABORTED that reading again mends (a
// follower shard no longer holding the version shard 0 gave a moment
// before, because the job moved on in between: worker/ps_group.cc).
absl::Status MarkedMovedUnderRead(const absl::Status& status);
// A worker: version `step` decoded to float32 into `out` (its size is the
// number of values), as FindWeights finds it; a read that a publish
// overtook is read again.
absl::Status ReadWeights(const SharedRegion& region, int64_t step,
                         absl::Span<float> out,
                         absl::Duration patience = absl::Seconds(2));

// dp-ps's side of the handover: a Unix socket in the abstract namespace
// with an unguessable name, and the descriptors waiting for each ticket.
// Connections are served side by side, so one that sends nothing delays no
// other; each has `kHandoverTimeout` to present its ticket.
class SharedMemoryOffer {
 public:
  // Tickets not redeemed within `ticket_lifetime` are withdrawn (their
  // descriptors closed).
  static absl::StatusOr<std::unique_ptr<SharedMemoryOffer>> Start(
      absl::Duration ticket_lifetime = absl::Minutes(1));
  ~SharedMemoryOffer();  // stops accepting and closes every descriptor left

  static constexpr absl::Duration kHandoverTimeout = absl::Seconds(2);

  // The socket's name (without the leading NUL of the abstract namespace).
  const std::string& socket_name() const { return name_; }
  // A one-time ticket for which the socket hands out `fds` (taken over: the
  // offer closes them once sent, or at the end) to a process of this user.
  // `owner` (a rank) holds one ticket at a time: a new one withdraws the
  // last, so a worker that never redeems its tickets costs nothing.
  std::string IssueTicket(int owner, std::vector<int> fds);
  // Tickets issued and neither redeemed nor withdrawn.
  int outstanding_tickets() const;

 private:
  struct Ticket {
    std::string secret;
    std::vector<int> fds;
    absl::Time expires;
  };
  SharedMemoryOffer(int listen_fd, std::string name,
                    absl::Duration ticket_lifetime);
  void Serve();
  // The descriptors of the ticket `secret` (removed), or none.
  std::vector<int> Redeem(absl::string_view secret);
  void WithdrawExpired(absl::Time now);

  const int listen_fd_;
  const std::string name_;
  const absl::Duration ticket_lifetime_;
  mutable absl::Mutex mu_;
  std::map<int, Ticket> tickets_ ABSL_GUARDED_BY(mu_);  // by owner
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// A worker's side: connects to dp-ps's socket, presents the ticket and
// receives the `count` descriptors (owned by the caller). UNAVAILABLE when
// the socket cannot be reached (another host, another network namespace);
// PERMISSION_DENIED for a ticket it refused; DATA_LOSS for another number
// of descriptors (all of them closed).
absl::StatusOr<std::vector<int>> FetchSharedMemory(
    const std::string& socket_name, const std::string& ticket, size_t count);

}  // namespace dp

#endif  // DP_COMMON_SHARED_MEMORY_H_
