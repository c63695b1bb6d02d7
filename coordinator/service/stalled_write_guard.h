// Cancels a server-streaming call whose client stops reading. A synchronous
// ServerWriter::Write blocks once the HTTP/2 flow-control windows are full and
// returns only when the client reads or the call ends. A client that keeps
// its stream open but reads nothing (a stopped process, a consumer stuck
// elsewhere) would hold the handler's thread, its stream slot and, for
// SummonFullParams, the job's operation slot for as long as its connection
// lives: keepalive pings do not notice, since the client's transport still
// answers them. The guard's watcher thread cancels the call (TryCancel, which
// gRPC allows from any thread) when one Write has waited `limit`, and the
// blocked Write then returns false. A slow client that keeps reading is not
// cut as long as one message drains within `limit` (a 4 MiB summon chunk
// within 60 s: above about 1 Mbit/s): each Write that completes starts the
// clock again.
#ifndef FLATSHARD_COORDINATOR_SERVICE_STALLED_WRITE_GUARD_H_
#define FLATSHARD_COORDINATOR_SERVICE_STALLED_WRITE_GUARD_H_

#include <cstdint>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace flatshard {

class StalledWriteGuard {
 public:
  // `limit` <= 0 or infinite: never cancels (no thread). `call` names the RPC
  // in the log line.
  StalledWriteGuard(grpc::ServerContext* context, absl::Duration limit, std::string call);
  ~StalledWriteGuard();  // stops the watcher; the call must still be live

  StalledWriteGuard(const StalledWriteGuard&) = delete;
  StalledWriteGuard& operator=(const StalledWriteGuard&) = delete;

  // writer->Write(message) under the watch; false when the call is over (the
  // client went away, or this guard cancelled it).
  template <typename Message>
  bool Write(grpc::ServerWriter<Message>* writer, const Message& message) {
    Begin();
    const bool written = writer->Write(message);
    End();
    return written;
  }

  // Whether this guard cancelled the call.
  bool cancelled() const;

 private:
  void Begin();
  void End();
  void Watch();
  bool StoppedOrWriting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StoppedOrMoved() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  grpc::ServerContext* const context_;
  const absl::Duration limit_;
  const std::string call_;
  mutable absl::Mutex mu_;
  // The Write in progress: its number (0: none) and when it started.
  uint64_t writing_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time started_ ABSL_GUARDED_BY(mu_);
  uint64_t watched_ ABSL_GUARDED_BY(mu_) = 0;  // the Write the watcher waits on
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;  // started by the first Write
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_SERVICE_STALLED_WRITE_GUARD_H_
