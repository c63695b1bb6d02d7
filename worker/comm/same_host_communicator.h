// Collectives among the ranks of one host that copy straight out of a peer
// process's memory (Linux cross-memory attach, process_vm_readv), as MPI's
// shared-memory transports do. Loopback TCP copies every byte twice through the
// kernel's socket buffers and, on a host whose cores also run the model, takes
// those cores from it: Gloo's ring moves ~1 GB/s here, one process_vm_readv
// ~6 GB/s (bench/RESULTS.md, "Same-host collectives").
//
// The inner communicator (Gloo) still carries what needs ordering: each large
// collective exchanges the buffers' addresses through its point-to-point
// messages, reads the peers' bytes, and ends with a barrier, so no rank
// returns (and lets its caller reuse the buffer) while a peer may still be
// reading it. Both are dissemination rounds, ceil(log2 W) hops each. Their
// failure paths are therefore Gloo's: a peer that died makes them fail, and
// Abort() wakes them. Small collectives, Gather and SendRecv go to the inner one as they
// are; so does everything when the probe at Wrap() fails.
//
// Each rank reduces its own chunk, reading every peer's copy of it in blocks
// and adding them in the Gloo ring's order (v_r + (v_{r-1} + (... + v_{r+1}))),
// so the results are bit for bit the ring's, whichever path a collective
// takes, and the fused gradient chunks (ReduceScatterChunked) equal the
// separate steps. Their float32 chunks that lie wholly inside the gradient
// are read as the caller holds them and finished by the reader (RawChunk,
// FinishRaw) wherever they already lie in place in the work buffer (at W=2,
// wherever they lie): only the others (the padding chunk, 16-bit reduce
// dtypes, a work buffer that is not the gradient) are produced for the peers.
// ReduceScatter's output may overlap its input only at this rank's chunk
// (peers read the others while it runs).
#ifndef FLATSHARD_WORKER_COMM_SAME_HOST_COMMUNICATOR_H_
#define FLATSHARD_WORKER_COMM_SAME_HOST_COMMUNICATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <sys/types.h>

#include "worker/comm/communicator.h"
#include "worker/comm/same_host_options.h"

namespace flatshard {

class SameHostCommunicator : public Communicator {
 public:
  // Every rank of `inner`'s group calls it together. Each rank reads a random
  // token every peer published, through process_vm_readv: that needs the same
  // host, the same PID namespace and ptrace permission (same user; no Yama
  // ptrace_scope >= 1 between siblings, no seccomp filter against it). If any
  // rank cannot read any peer, every rank gets `inner` back unchanged and
  // `why_not` (when given) says which rank failed and why. Fails only when the
  // inner communicator's own collectives do.
  static absl::StatusOr<std::unique_ptr<Communicator>> Wrap(std::unique_ptr<Communicator> inner,
                                                            const SameHostOptions& options,
                                                            std::string* why_not = nullptr);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllGather(const void* input, void* output, size_t count, DType dtype) override;
  absl::Status ReduceScatter(const void* input, void* output, size_t count, DType dtype) override;
  absl::Status ReduceScatterInPlace(void* buffer, size_t count, DType dtype) override;
  absl::Status ReduceScatterChunked(ReduceScatterChunks& chunks, void* work, size_t count,
                                    DType dtype) override;
  absl::Status AllReduce(void* buffer, size_t count, DType dtype, ReduceOp op) override;
  absl::Status Broadcast(void* buffer, size_t count, DType dtype, int root) override;
  absl::Status Gather(const void* input, void* output, size_t count, DType dtype,
                      int root) override {
    return inner_->Gather(input, output, count, dtype, root);
  }
  absl::Status SendRecv(const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes,
                        int from) override {
    return inner_->SendRecv(send, send_bytes, to, recv, recv_bytes, from);
  }
  absl::Status Barrier() override;
  void Abort(const std::string& reason) override;
  // The inner communicator's sub-group, reading the same processes.
  absl::StatusOr<std::unique_ptr<Communicator>> CreateSubgroup(const std::vector<int>& ranks,
                                                               absl::string_view name) override;

 private:
  SameHostCommunicator(std::unique_ptr<Communicator> inner, std::vector<pid_t> pids,
                       SameHostOptions options);

  // Collectives the inner communicator runs as they are: small ones, and all
  // of a one-rank group (a sub-group may have one).
  bool Inner(size_t bytes) const { return size() == 1 || bytes < options_.min_bytes; }
  // Every rank's `address`, by rank; also a barrier.
  absl::StatusOr<std::vector<uint64_t>> ExchangeAddresses(const void* address);
  // Every rank's `value` (an address, maybe with kRawFlag), in rank order.
  absl::StatusOr<std::vector<uint64_t>> Exchange(uint64_t value);
  // Copies `bytes` at `remote` in rank `peer`'s memory to `local`.
  absl::Status ReadPeer(int peer, uint64_t remote, void* local, size_t bytes);
  // How ReduceFromPeers hands its sums to FSDP's gradient chunks.
  struct ChunkSums {
    ReduceScatterChunks* chunks = nullptr;
    // W=2: the one peer's value is its RawChunk, which ProduceAndAdd finishes.
    bool received_raw = false;
    // W>=3, by rank: that peer's value is its RawChunk, finished as it is read.
    std::vector<bool> finish_on_read;
  };
  // acc[0, count) = acc (or `own`, when given) + the sum of every peer's
  // elements at `remotes[p] + offset`, in the ring's order; with `sums`,
  // the last addition is chunks->ProduceAndAdd of this rank's chunk and the
  // result is consumed, never written to acc.
  absl::Status ReduceFromPeers(const std::vector<uint64_t>& remotes, size_t offset,
                               const std::byte* own, std::byte* acc, size_t count, DType dtype,
                               ReduceOp op, const ChunkSums* sums = nullptr);
  // Both reduce-scatters once the addresses are known: this rank's chunk of
  // every rank's `input` summed into `output` (which may be that chunk).
  absl::Status ReduceOwnChunk(const void* input, void* output, size_t count, DType dtype);
  // After a failed read: make the peers' barrier fail at once rather than time
  // out, and say why.
  absl::Status Fail(absl::Status status);

  std::unique_ptr<Communicator> inner_;
  std::vector<pid_t> pids_;  // by rank of this group
  SameHostOptions options_;
  std::vector<std::byte> block_;  // a peer's block, read before it is added
  std::vector<std::byte> sum_;    // the peers' partial sum of a block
  std::atomic<bool> aborted_{false};
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_SAME_HOST_COMMUNICATOR_H_
