// Presents a flatshard Store as the gloo::rendezvous::Store that Gloo's
// connectFullMesh uses. Gloo's interface throws; store errors become
// gloo::IoException here and are turned back into Status by GlooCommunicator.
#ifndef FLATSHARD_WORKER_COMM_GLOO_STORE_ADAPTER_H_
#define FLATSHARD_WORKER_COMM_GLOO_STORE_ADAPTER_H_

#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "absl/time/time.h"

#include "worker/comm/store.h"

namespace flatshard {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<flatshard::Store> store, std::string prefix,
                   absl::Duration timeout)
      : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }

  std::shared_ptr<flatshard::Store> store_;
  std::string prefix_;
  absl::Duration timeout_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_GLOO_STORE_ADAPTER_H_
