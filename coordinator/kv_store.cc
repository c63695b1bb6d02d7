#include "coordinator/kv_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flatshard {

absl::Status KvStore::CheckKey(const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("key must not be empty");
  if (key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key is ", key.size(), " bytes, more than the limit of ", kMaxKeyBytes));
  }
  return absl::OkStatus();
}

absl::Status KvStore::Set(const std::string& key, std::string value) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value for key '", key, "' is ", value.size(),
                                                   " bytes, more than the limit of ",
                                                   kMaxValueBytes));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = std::move(value);
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> KvStore::Get(const std::string& key) const {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return absl::NotFoundError(absl::StrCat("key '", key, "' is not set"));
  return it->second;
}

absl::Status KvStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) const {
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
  }
  std::unique_lock<std::mutex> lock(mu_);
  auto missing = [&] {
    std::vector<std::string> out;
    for (const std::string& key : keys) {
      if (!values_.contains(key)) out.push_back(key);
    }
    return out;
  };
  const bool all = changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                                     [&] { return missing().empty(); });
  if (all) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat("timed out after ", absl::FormatDuration(timeout),
                                                  " waiting for key(s) ",
                                                  absl::StrJoin(missing(), ", ")));
}

absl::StatusOr<int64_t> KvStore::Add(const std::string& key, int64_t delta) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    if (it != values_.end() && !absl::SimpleAtoi(it->second, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("key '", key, "' does not hold an integer"));
    }
    value += delta;
    values_[key] = std::to_string(value);
  }
  changed_.notify_all();
  return value;
}

void KvStore::DeletePrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string start = prefix + "/";
  for (auto it = values_.lower_bound(start); it != values_.end() && it->first.starts_with(start);) {
    it = values_.erase(it);
  }
}

size_t KvStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.size();
}

}  // namespace flatshard
