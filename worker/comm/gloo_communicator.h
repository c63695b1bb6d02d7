// Communicator over Gloo's TCP transport, for host memory. Rendezvous goes
// through a flatshard Store (GlooStoreAdapter). The collectives are rings over
// Gloo's unbound buffers (Gloo's own pairs and slots; our algorithms):
// - reduce-scatter waits for its sends before reusing a buffer, which
//   Debian's ReduceScatterHalvingDoubling does not (wrong sums,
//   bench/CEILINGS.md);
// - every wait can be interrupted by Abort(), which Gloo's built-in
//   algorithms cannot (they create their buffers internally and ignore an
//   aborted wait), so a rank blocked on a dead peer returns at once.
#ifndef FLATSHARD_WORKER_COMM_GLOO_COMMUNICATOR_H_
#define FLATSHARD_WORKER_COMM_GLOO_COMMUNICATOR_H_

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"

#include "worker/comm/abort_signal.h"
#include "worker/comm/communicator.h"
#include "worker/comm/same_host_options.h"
#include "worker/comm/store.h"

namespace gloo {
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace flatshard {

class GlooMeshContext;

struct GlooOptions {
  std::string hostname = "127.0.0.1";          // address peers connect to
  absl::Duration timeout = absl::Seconds(60);  // per collective and for rendezvous
  std::string prefix = "gloo";                 // store namespace for this group
  // Ranks of one host read each other's buffers directly (process_vm_readv)
  // instead of over loopback TCP, when every rank's probe allows it
  // (SameHostCommunicator, applied by ConnectRuntimeGroups).
  SameHostOptions same_host;
  // When set, aborting it ends this group's Gloo connection in progress and
  // then aborts the communicator, as Abort() does: the one handle a worker
  // holds for the groups a configure is still building. A wait in the
  // store is ended by aborting the store (the worker's signal does both).
  std::shared_ptr<AbortSignal> abort;
  // The members' ranks in the job's world, by group rank; empty for the
  // world itself. Failures name peers by these (UnreachablePeer): a pair
  // that did not connect, and one that failed after connecting.
  std::vector<int> world_ranks;
};

class GlooCommunicator : public Communicator {
 public:
  // Connects a full mesh among `size` ranks through `store`. Every rank calls it.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(std::shared_ptr<Store> store,
                                                                  int rank, int size,
                                                                  const GlooOptions& options);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllGather(const void* input, void* output, size_t count, DType dtype) override;
  absl::Status ReduceScatter(const void* input, void* output, size_t count, DType dtype) override;
  absl::Status ReduceScatterInPlace(void* buffer, size_t count, DType dtype) override;
  absl::Status ReduceScatterChunked(ReduceScatterChunks& chunks, void* work, size_t count,
                                    DType dtype) override;
  absl::Status AllReduce(void* buffer, size_t count, DType dtype, ReduceOp op) override;
  absl::Status Broadcast(void* buffer, size_t count, DType dtype, int root) override;
  absl::Status Gather(const void* input, void* output, size_t count, DType dtype,
                      int root) override;
  absl::Status SendRecv(const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes,
                        int from) override;
  absl::Status Barrier() override;
  void Abort(const std::string& reason) override;
  absl::StatusOr<std::unique_ptr<Communicator>> CreateSubgroup(const std::vector<int>& ranks,
                                                               absl::string_view name) override;

 private:
  GlooCommunicator(std::shared_ptr<Store> store, std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<GlooMeshContext> context, int rank, int size,
                   GlooOptions options);

  class ActiveBuffer;

  template <typename Fn>
  absl::Status Guard(absl::string_view op, Fn&& fn);
  // Ends Create: every rank sends a byte to every other and waits for one
  // from each. A peer's byte means its ConnectFullMesh is done, so it has
  // accepted its end of every pair with this rank; until then a reset
  // connection can kill it (GlooPairListens), and so until then Abort only
  // wakes the waits, and the pairs close without a reset when this
  // communicator is destroyed. After it every member is connected, too.
  absl::Status ConfirmMesh();
  // Resets the connections to every peer (Abort, and a wait that gave up),
  // once the mesh is confirmed; before, does nothing (ConfirmMesh).
  void ClosePairs();

  // The ring algorithms; they throw (Gloo does) and run inside a Guard.
  // With `chunks` set, the input is produced and the result consumed as the
  // ring goes (Communicator::ReduceScatterChunked); op is then kSum.
  void RingReduceScatterInPlace(std::byte* data, size_t count, DType dtype, ReduceOp op,
                                ReduceScatterChunks* chunks = nullptr);
  void RingAllGatherInPlace(std::byte* data, size_t chunk_bytes);

  std::shared_ptr<Store> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<GlooMeshContext> context_;
  int rank_;
  int size_;
  GlooOptions options_;
  std::vector<std::byte> work_;          // reduce-scatter partial sums, kept across calls
  std::vector<std::byte> scratch_;       // reduce-scatter receive buffer, kept across calls
  std::vector<std::byte> result_block_;  // the last ring step's result, a block at a time

  // ConfirmMesh's bytes, kept until the pairs that may still write into
  // them are gone (the destructor), when the handshake did not finish.
  std::vector<char> handshake_in_;
  char handshake_out_ = 1;
  std::unique_ptr<gloo::transport::UnboundBuffer> handshake_recv_;
  std::unique_ptr<gloo::transport::UnboundBuffer> handshake_send_;

  std::mutex abort_mu_;  // guards the four below
  bool aborted_ = false;
  bool confirmed_ = false;  // ConfirmMesh succeeded
  std::string abort_reason_;
  std::vector<gloo::transport::UnboundBuffer*> active_;

  // Last: it goes first, so its hook never runs on a half-destroyed object.
  std::unique_ptr<AbortSignal::Registration> abort_watch_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_GLOO_COMMUNICATOR_H_
