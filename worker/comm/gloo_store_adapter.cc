#include "worker/comm/gloo_store_adapter.h"

#include <gloo/common/error.h>

namespace flatshard {
namespace {

[[noreturn]] void Throw(const absl::Status& status) {
  throw ::gloo::IoException(std::string(status.ToString()));
}

}  // namespace

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_->Set(Key(key), std::string(data.begin(), data.end()));
  if (!status.ok()) Throw(status);
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  absl::StatusOr<std::string> value = store_->Get(Key(key), timeout_);
  if (!value.ok()) Throw(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& key : keys) prefixed.push_back(Key(key));
  absl::Status status = store_->Wait(prefixed, absl::FromChrono(timeout));
  if (!status.ok()) Throw(status);
}

}  // namespace flatshard
