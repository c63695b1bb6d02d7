#include "coordinator/kv_store.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flatshard {
namespace {

// The namespace a key's usage counts under: "job/<name>", else its first
// path component.
std::string JobNamespace(const std::string& key) {
  size_t end = key.find('/');
  if (key.starts_with("job/") && end != std::string::npos) end = key.find('/', end + 1);
  return end == std::string::npos ? key : key.substr(0, end);
}

}  // namespace

absl::Status KvStore::PutLocked(const std::string& key, std::string value) {
  const std::string ns = JobNamespace(key);
  // Made only for a put that succeeds: a refused one leaves no entry behind.
  const auto found = usage_.find(ns);
  Usage usage = found == usage_.end() ? Usage{} : found->second;
  auto it = values_.find(key);
  const size_t old_bytes = it == values_.end() ? 0 : it->first.size() + it->second.size();
  const size_t new_bytes = key.size() + value.size();
  const bool added = it == values_.end();
  if (added && usage.keys + 1 > limits_.keys_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous store limit keys_per_job (", limits_.keys_per_job, ") reached for '", ns, "'"));
  }
  if (usage.bytes - old_bytes + new_bytes > limits_.bytes_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat("rendezvous store limit bytes_per_job (",
                                                     limits_.bytes_per_job, ") reached for '", ns,
                                                     "'"));
  }
  if (added && total_.keys + 1 > limits_.keys_total) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous store limit keys_total (", limits_.keys_total, ") reached"));
  }
  if (total_.bytes - old_bytes + new_bytes > limits_.bytes_total) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous store limit bytes_total (", limits_.bytes_total, ") reached"));
  }
  if (added) {
    ++usage.keys;
    ++total_.keys;
  }
  usage.bytes = usage.bytes - old_bytes + new_bytes;
  total_.bytes = total_.bytes - old_bytes + new_bytes;
  usage_[ns] = usage;
  values_[key] = std::move(value);
  return absl::OkStatus();
}

absl::Status KvStore::CheckNotAbandonedLocked(const std::string& key) const {
  for (const auto& [prefix, reason] : abandoned_) {
    if (key.size() > prefix.size() && key.starts_with(prefix) && key[prefix.size()] == '/') {
      return absl::AbortedError(
          absl::StrCat("the rendezvous under '", prefix, "' was abandoned: ", reason));
    }
  }
  return absl::OkStatus();
}

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
    if (absl::Status s = CheckNotAbandonedLocked(key); !s.ok()) return s;
    if (absl::Status put = PutLocked(key, std::move(value)); !put.ok()) return put;
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> KvStore::Get(const std::string& key) const {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = CheckNotAbandonedLocked(key); !s.ok()) return s;
  auto it = values_.find(key);
  if (it == values_.end()) return absl::NotFoundError(absl::StrCat("key '", key, "' is not set"));
  return it->second;
}

absl::Status KvStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout,
                           const std::function<bool()>& gave_up) const {
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
  absl::Status abandoned;
  const auto ready = [&] {
    for (const std::string& key : keys) {
      abandoned = CheckNotAbandonedLocked(key);
      if (!abandoned.ok()) return true;
    }
    return missing().empty();
  };
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  const auto check = absl::ToChronoNanoseconds(kGaveUpCheck);
  bool done = false;
  ++waiting_;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    done = changed_.wait_until(lock, gave_up ? std::min(deadline, now + check) : deadline, ready);
    if (done || std::chrono::steady_clock::now() >= deadline) break;
    if (gave_up && gave_up()) {
      --waiting_;
      return absl::CancelledError("the caller gave up on the wait");
    }
  }
  --waiting_;
  if (!abandoned.ok()) return abandoned;
  if (done) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat("timed out after ", absl::FormatDuration(timeout),
                                                  " waiting for key(s) ",
                                                  absl::StrJoin(missing(), ", ")));
}

absl::StatusOr<int64_t> KvStore::Add(const std::string& key, int64_t delta) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status s = CheckNotAbandonedLocked(key); !s.ok()) return s;
    auto it = values_.find(key);
    if (it != values_.end() && !absl::SimpleAtoi(it->second, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("key '", key, "' does not hold an integer"));
    }
    if (__builtin_add_overflow(value, delta, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("store_add.delta ", delta, " overflows the integer at key '", key, "'"));
    }
    if (absl::Status put = PutLocked(key, std::to_string(value)); !put.ok()) return put;
  }
  changed_.notify_all();
  return value;
}

void KvStore::DeletePrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string start = prefix + "/";
  for (auto it = values_.lower_bound(start); it != values_.end() && it->first.starts_with(start);) {
    total_.keys -= 1;
    total_.bytes -= it->first.size() + it->second.size();
    auto usage = usage_.find(JobNamespace(it->first));
    if (usage != usage_.end()) {
      usage->second.keys -= 1;
      usage->second.bytes -= it->first.size() + it->second.size();
      if (usage->second.keys == 0) usage_.erase(usage);
    }
    it = values_.erase(it);
  }
  for (auto it = abandoned_.lower_bound(start);
       it != abandoned_.end() && it->first.starts_with(start);) {
    it = abandoned_.erase(it);
  }
}

void KvStore::Abandon(const std::string& prefix, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abandoned_[prefix] = reason;
  }
  changed_.notify_all();
}

size_t KvStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.size();
}

size_t KvStore::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_;
}

}  // namespace flatshard
