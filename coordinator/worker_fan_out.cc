#include "coordinator/worker_fan_out.h"

#include <cstddef>
#include <utility>

#include "absl/synchronization/blocking_counter.h"

namespace flatshard {

std::vector<absl::StatusOr<v1::GetStatusResponse>> GetStatusAll(
    absl::Span<WorkerClient* const> workers, absl::Time deadline) {
  std::vector<absl::StatusOr<v1::GetStatusResponse>> answers(workers.size());
  // Each answer writes its own element; the counter orders the writes
  // before the wait returns.
  absl::BlockingCounter answered(static_cast<int>(workers.size()));
  for (size_t i = 0; i < workers.size(); ++i) {
    workers[i]->GetStatusAsync(deadline, [&answers, &answered, i](auto answer) {
      answers[i] = std::move(answer);
      answered.DecrementCount();
    });
  }
  answered.Wait();
  return answers;
}

std::vector<absl::Status> AbortAll(absl::Span<WorkerClient* const> workers, uint64_t epoch,
                                   const std::string& reason, absl::Time deadline) {
  std::vector<absl::Status> outcomes(workers.size());
  absl::BlockingCounter answered(static_cast<int>(workers.size()));
  for (size_t i = 0; i < workers.size(); ++i) {
    workers[i]->AbortAsync(epoch, reason, deadline, [&outcomes, &answered, i](absl::Status s) {
      outcomes[i] = std::move(s);
      answered.DecrementCount();
    });
  }
  answered.Wait();
  return outcomes;
}

}  // namespace flatshard
