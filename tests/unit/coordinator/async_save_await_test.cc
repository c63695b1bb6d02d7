// AwaitAsyncSave against an in-process fake worker: a background write whose
// save counter stands still is given up on at the stall timeout even while
// training moves the worker's main counter, one whose counter moves is
// waited for, a worker that answers no probe is stalled too, and without a
// stall timeout, or once the job failed, the wait is what it was. Every
// rank's write is awaited at once: a stuck last rank is found at the stall
// timeout while the ranks before it still write, with no thread per rank,
// and answers given on the calling thread loop rather than recurse.
// SettleAsyncSave's verdict is tested in settle_async_save_test.cc.
#include "coordinator/async_save_await.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

constexpr char kDirectory[] = "mlp/stuck.partial";

// A worker writing one async save: it answers AwaitSave at its
// `answer_at_call`-th call (0: never), and until then as a worker whose
// write still runs does, at the call's deadline.
class WritingWorker : public WorkerClient {
 public:
  void Execute(const v1::CommandBatch*, absl::Time, ExecuteDone done) override {
    done(absl::UnimplementedError("fake worker"));
  }
  void CancelAll() override {}
  void ConfigureAsync(v1::ConfigureRequest, absl::Time, absl::Time, ConfigureDone done) override {
    done(absl::OkStatus());
  }
  void AbortAsync(uint64_t, const std::string&, absl::Time, AbortDone done) override {
    done(absl::OkStatus());
  }
  ~WritingWorker() override {
    std::vector<std::thread> calls;
    {
      std::lock_guard<std::mutex> lock(mu_);
      calls.swap(calls_in_flight_);
    }
    for (std::thread& call : calls) call.join();
  }
  // A probe answers at once.
  void GetStatusAsync(absl::Time, GetStatusDone done) override {
    const int probe = ++probes_;
    if (dead_) {
      done(absl::UnavailableError("connection refused"));
      return;
    }
    if (probe == finish_at_probe_) finished_ = true;  // its final fsync ends now
    v1::GetStatusResponse response;
    response.set_progress(static_cast<uint64_t>(probe));  // training moves on
    if (!old_worker_) response.set_save_progress(write_moves_ ? static_cast<uint64_t>(probe) : 7);
    done(response);
  }
  // Answered on a thread of the call's own, as a call in flight is.
  void AwaitSave(const std::string& directory, absl::Time deadline, AwaitSaveDone done) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_in_flight_.emplace_back(
        [this, directory, deadline, done = std::move(done)] { done(Answer(directory, deadline)); });
  }
  absl::StatusOr<v1::CommandResult> Answer(const std::string& directory, absl::Time deadline) {
    const int call = ++calls_;
    last_deadline_ = deadline;
    longest_call_ = std::max(longest_call_, deadline - absl::Now());
    if (directory != kDirectory) return absl::NotFoundError(absl::StrCat("no save ", directory));
    if (!answer_.ok()) return answer_;
    if (finished_ || (answer_at_call_ > 0 && call >= answer_at_call_)) {
      v1::CommandResult result;
      result.set_rank(1);
      return result;
    }
    // The worker's own wait for the write: it returns at the deadline.
    std::this_thread::sleep_until(absl::ToChronoTime(deadline));
    return absl::DeadlineExceededError("async save still writing");
  }
  absl::Status Summon(const v1::CommandBatch&, absl::Time, const ChunkSink&) override {
    return absl::OkStatus();
  }
  void JoinSummonAsync(const v1::CommandBatch*, absl::Time, JoinSummonDone done) override {
    done(absl::OkStatus());
  }
  void Disconnect() override {}  // no connection of its own
  std::string address() const override { return "fake:1"; }

  bool write_moves_ = false;
  bool dead_ = false;
  bool old_worker_ = false;  // sends no save_progress
  int finish_at_probe_ = 0;  // > 0: the write ends at that probe, its counter still
  std::atomic<bool> finished_{false};
  int answer_at_call_ = 0;
  absl::Status answer_;  // not OK: every call answers it
  std::atomic<int> probes_{0};
  std::atomic<int> calls_{0};
  absl::Time last_deadline_;
  absl::Duration longest_call_ = absl::ZeroDuration();  // the longest deadline given

 private:
  std::mutex mu_;
  std::vector<std::thread> calls_in_flight_;  // joined when the worker goes
};

TEST(AsyncSaveAwaitTest, AStillWriteIsGivenUpAtTheStallTimeoutWhileTrainingMovesOn) {
  WritingWorker worker;
  const absl::Time start = absl::Now();
  AwaitedSave awaited =
      AwaitAsyncSave(worker, 1, kDirectory, start + absl::Seconds(60), absl::Milliseconds(200), {});
  ASSERT_TRUE(awaited.stall.has_value());
  EXPECT_EQ(awaited.stall->rank, 1);
  EXPECT_GE(awaited.stall->still_for, absl::Milliseconds(200));
  EXPECT_EQ(awaited.stall->progress, 7u);
  EXPECT_EQ(awaited.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  const std::string message(awaited.result.status().message());
  EXPECT_THAT(message, HasSubstr("async write into 'mlp/stuck.partial' made no progress for "));
  EXPECT_THAT(message, HasSubstr("(its save progress counter stayed at 7)"));
  EXPECT_THAT(message, HasSubstr("--stall-timeout is 200ms"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "waited for the deadline, not the stall";
  // Cut into probe intervals (20 ms at a 200 ms timeout): a call and a
  // probe each, and one last call when the stall is found.
  EXPECT_GE(worker.calls_.load(), 3);
  EXPECT_LE(worker.longest_call_, absl::Milliseconds(20));
  EXPECT_EQ(worker.probes_.load() + 1, worker.calls_.load());
}

TEST(AsyncSaveAwaitTest, AWriteWhoseCounterMovesIsWaitedForManyTimeouts) {
  WritingWorker worker;
  worker.write_moves_ = true;
  worker.answer_at_call_ = 40;  // 40 intervals of 10 ms: eight timeouts
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, absl::Now() + absl::Seconds(60),
                                       absl::Milliseconds(50), {});
  EXPECT_FALSE(awaited.stall.has_value());
  ASSERT_TRUE(awaited.result.ok()) << awaited.result.status();
  EXPECT_EQ(awaited.result->rank(), 1);
  EXPECT_EQ(worker.calls_.load(), 40);
}

// The write ends at the very probe that finds it still for the timeout (the
// first probe starts its clock; the second, 10 ms on, is past a 10 ms
// timeout), as a last fsync, which moves no counter, would: the last look
// collects it instead of failing the rank.
TEST(AsyncSaveAwaitTest, AWriteThatEndsAsItIsFoundStillIsCollected) {
  WritingWorker worker;
  worker.finish_at_probe_ = 2;
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, absl::Now() + absl::Seconds(60),
                                       absl::Milliseconds(10), {});
  EXPECT_FALSE(awaited.stall.has_value()) << awaited.result.status();
  ASSERT_TRUE(awaited.result.ok()) << awaited.result.status();
  EXPECT_EQ(worker.probes_.load(), 2);
  EXPECT_EQ(worker.calls_.load(), 3);
}

// A worker built before save_progress sends none: its write is awaited as
// before, never failed as stalled (its counter, absent, is not read again),
// though its write outlasts many stall timeouts; but still in intervals, so
// that a failed job ends the wait.
TEST(AsyncSaveAwaitTest, AWorkerThatSendsNoSaveProgressIsAwaitedUnwatched) {
  WritingWorker worker;
  worker.old_worker_ = true;
  worker.answer_at_call_ = 40;  // 40 intervals of 10 ms: forty timeouts
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, absl::Now() + absl::Seconds(60),
                                       absl::Milliseconds(10), {});
  EXPECT_FALSE(awaited.stall.has_value());
  ASSERT_TRUE(awaited.result.ok()) << awaited.result.status();
  EXPECT_EQ(worker.calls_.load(), 40);
  EXPECT_EQ(worker.probes_.load(), 1);

  WritingWorker forever;
  forever.old_worker_ = true;
  std::atomic<int> asked{0};
  awaited = AwaitAsyncSave(forever, 1, kDirectory, absl::Now() + absl::Seconds(60),
                           absl::Milliseconds(100), [&asked] { return ++asked > 3; });
  EXPECT_FALSE(awaited.stall.has_value());
  EXPECT_EQ(awaited.result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(forever.calls_.load(), 3);
}

TEST(AsyncSaveAwaitTest, AWorkerThatAnswersNoProbeIsStalledToo) {
  WritingWorker worker;
  worker.dead_ = true;
  AwaitedSave awaited = AwaitAsyncSave(worker, 0, kDirectory, absl::Now() + absl::Seconds(60),
                                       absl::Milliseconds(100), {});
  ASSERT_TRUE(awaited.stall.has_value());
  EXPECT_FALSE(awaited.stall->progress.has_value());
  EXPECT_THAT(std::string(awaited.result.status().message()),
              HasSubstr("(it did not answer its progress probes)"));
}

TEST(AsyncSaveAwaitTest, TheDeadlineEndsTheWaitAsStillWritingNotAsAStall) {
  WritingWorker worker;
  worker.write_moves_ = true;
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, absl::Now() + absl::Milliseconds(150),
                                       absl::Seconds(10), {});
  EXPECT_FALSE(awaited.stall.has_value());
  EXPECT_EQ(awaited.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(awaited.result.status().message()), HasSubstr("still writing"));
}

// The detector off: the write is only awaited, never probed, in calls of a
// second, so that a failed job still ends the wait within one.
TEST(AsyncSaveAwaitTest, WithoutAStallTimeoutTheWriteIsAwaitedInCallsOfASecond) {
  WritingWorker worker;
  worker.answer_at_call_ = 1;
  const absl::Time start = absl::Now();
  AwaitedSave awaited =
      AwaitAsyncSave(worker, 1, kDirectory, start + absl::Seconds(60), absl::ZeroDuration(), {});
  ASSERT_TRUE(awaited.result.ok()) << awaited.result.status();
  EXPECT_EQ(worker.calls_.load(), 1);
  EXPECT_LE(worker.last_deadline_, absl::Now() + absl::Seconds(1));
  EXPECT_EQ(worker.probes_.load(), 0);

  WritingWorker forever;
  forever.write_moves_ = true;
  std::atomic<int> asked{0};
  // The job fails during the second call.
  awaited = AwaitAsyncSave(forever, 1, kDirectory, absl::Now() + absl::Seconds(60),
                           absl::ZeroDuration(), [&asked] { return ++asked > 2; });
  EXPECT_FALSE(awaited.stall.has_value());
  EXPECT_EQ(awaited.result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(forever.calls_.load(), 2);
  EXPECT_EQ(forever.probes_.load(), 0);
}

TEST(AsyncSaveAwaitTest, AnAnswerOtherThanStillWritingEndsTheWaitAtOnce) {
  WritingWorker worker;
  worker.answer_ = absl::UnavailableError("connection refused");
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, absl::Now() + absl::Seconds(60),
                                       absl::Milliseconds(100), {});
  EXPECT_FALSE(awaited.stall.has_value());
  EXPECT_EQ(awaited.result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(worker.calls_.load(), 1);
  EXPECT_EQ(worker.probes_.load(), 0);
}

TEST(AsyncSaveAwaitTest, AJobThatFailedMeanwhileEndsTheWaitBeforeTheNextCall) {
  WritingWorker worker;
  worker.write_moves_ = true;
  std::atomic<int> asked{0};
  // The job fails during the third interval.
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, absl::Now() + absl::Seconds(60),
                                       absl::Milliseconds(100), [&asked] { return ++asked > 3; });
  EXPECT_FALSE(awaited.stall.has_value());
  EXPECT_EQ(awaited.result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(worker.calls_.load(), 3);
}

// Ranks 0 and 1 write on (their counters move) to the deadline; rank 2's
// write is stuck. Awaited one after another, rank 2 would be looked at only
// after the deadline.
TEST(AsyncSaveAwaitTest, AStuckLastRankIsFoundAtTheStallTimeoutWhileTheOthersStillWrite) {
  std::vector<std::shared_ptr<WorkerClient>> workers;
  for (int r = 0; r < 3; ++r) {
    auto worker = std::make_shared<WritingWorker>();
    worker->write_moves_ = r < 2;
    workers.push_back(worker);
  }
  std::atomic<int> handed{0};
  std::atomic<int> handed_rank{-1};
  const absl::Time start = absl::Now();
  AwaitedSaves awaited =
      AwaitAsyncSaves(workers, kDirectory, start + absl::Seconds(20), absl::Milliseconds(200), {},
                      [&](int rank, const AwaitedSave& stuck) {
                        ++handed;
                        handed_rank = rank;
                        EXPECT_TRUE(stuck.stall.has_value());
                      });
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "rank 2 was looked at after the others";
  ASSERT_TRUE(awaited.stalled.has_value());
  EXPECT_EQ(*awaited.stalled, 2);
  EXPECT_EQ(handed.load(), 1);
  EXPECT_EQ(handed_rank.load(), 2);
  ASSERT_EQ(awaited.ranks.size(), 3u);
  EXPECT_THAT(std::string(awaited.ranks[2].result.status().message()),
              HasSubstr("(its save progress counter stayed at 7)"));
  // The others' waits end at their next interval, as given up on.
  for (size_t r : {size_t{0}, size_t{1}}) {
    EXPECT_FALSE(awaited.ranks[r].stall.has_value()) << "rank " << r;
    EXPECT_EQ(awaited.ranks[r].result.status().code(), absl::StatusCode::kCancelled)
        << "rank " << r;
  }
}

TEST(AsyncSaveAwaitTest, WhenEveryWriteIsStuckOnlyOneRankIsHandedOn) {
  std::vector<std::shared_ptr<WorkerClient>> workers(4);
  for (std::shared_ptr<WorkerClient>& worker : workers) worker = std::make_shared<WritingWorker>();
  std::atomic<int> handed{0};
  std::atomic<int> handed_rank{-1};
  AwaitedSaves awaited =
      AwaitAsyncSaves(workers, kDirectory, absl::Now() + absl::Seconds(20), absl::Milliseconds(100),
                      {}, [&](int rank, const AwaitedSave&) {
                        ++handed;
                        handed_rank = rank;
                      });
  EXPECT_EQ(handed.load(), 1);
  ASSERT_TRUE(awaited.stalled.has_value());
  EXPECT_EQ(*awaited.stalled, handed_rank.load());
  EXPECT_TRUE(awaited.ranks[static_cast<size_t>(*awaited.stalled)].stall.has_value());
}

TEST(AsyncSaveAwaitTest, EveryRankIsCollectedAndAFailedJobEndsEveryWait) {
  std::vector<std::shared_ptr<WorkerClient>> workers;
  for (int r = 0; r < 2; ++r) {
    auto worker = std::make_shared<WritingWorker>();
    worker->write_moves_ = true;
    worker->answer_at_call_ = r == 0 ? 3 : 0;  // rank 0 finishes, rank 1 writes on
    workers.push_back(worker);
  }
  std::atomic<bool> job_failed{false};
  std::thread failer([&] {
    // Rank 0 answers at its third call; the job fails only after that (or,
    // should rank 0 never get there, at 10 s, which the checks below fail).
    const absl::Time give_up_at = absl::Now() + absl::Seconds(10);
    while (static_cast<WritingWorker&>(*workers[0]).calls_.load() < 3 && absl::Now() < give_up_at) {
      std::this_thread::yield();
    }
    job_failed = true;
  });
  AwaitedSaves awaited = AwaitAsyncSaves(
      workers, kDirectory, absl::Now() + absl::Seconds(20), absl::Seconds(5),
      [&] { return job_failed.load(); }, [](int, const AwaitedSave&) { ADD_FAILURE(); });
  failer.join();
  EXPECT_FALSE(awaited.stalled.has_value());
  ASSERT_TRUE(awaited.ranks[0].result.ok()) << awaited.ranks[0].result.status();
  EXPECT_EQ(awaited.ranks[1].result.status().code(), absl::StatusCode::kCancelled);
}

// A client may answer on the thread that starts the call (WorkerClient
// allows it): 200,000 "still writing" answers given at once, on the same
// thread, are awaited in a loop, not in as many nested calls, which would
// overflow the stack.
class InlineWorker : public WritingWorker {
 public:
  void AwaitSave(const std::string&, absl::Time, AwaitSaveDone done) override {
    if (++calls_ < answer_at_call_) {
      done(absl::DeadlineExceededError("async save still writing"));
      return;
    }
    v1::CommandResult result;
    result.set_rank(1);
    done(result);
  }
};

TEST(AsyncSaveAwaitTest, AnswersOnTheCallingThreadAreAwaitedInALoop) {
  InlineWorker worker;
  worker.answer_at_call_ = 200'000;
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, absl::Now() + absl::Seconds(60),
                                       absl::ZeroDuration(), {});
  ASSERT_TRUE(awaited.result.ok()) << awaited.result.status();
  EXPECT_EQ(worker.calls_.load(), 200'000);
}

// Many ranks, each call answered by one "network" thread at its deadline
// (or at once when the write is done), as the RPC library's few callback
// threads answer: the wait itself must hold no thread per rank. 1,024 ranks
// whose writes end at their third call are all collected while the process
// never runs more than a handful of threads. Awaited in a thread per rank,
// as before, it ran over 1,024.
class ScheduledWorkers {
 public:
  ScheduledWorkers() : network_([this] { Serve(); }) {}
  ~ScheduledWorkers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    network_.join();
  }
  // Queues `done` to run at `at` with `answer`.
  void Schedule(absl::Time at, absl::StatusOr<v1::CommandResult> answer,
                WorkerClient::AwaitSaveDone done) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      due_.emplace(at, Pending{std::move(answer), std::move(done)});
    }
    wake_.notify_all();
  }
  int most_threads() const { return most_threads_.load(); }

 private:
  struct Pending {
    absl::StatusOr<v1::CommandResult> answer;
    WorkerClient::AwaitSaveDone done;
  };
  void Serve() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (due_.empty()) {
        wake_.wait(lock);
        continue;
      }
      const absl::Time at = due_.begin()->first;
      if (absl::Now() < at) {
        wake_.wait_until(lock, absl::ToChronoTime(at));
        continue;
      }
      Pending pending = std::move(due_.begin()->second);
      due_.erase(due_.begin());
      lock.unlock();
      most_threads_ = std::max(most_threads_.load(), ThreadsNow());
      pending.done(std::move(pending.answer));  // may schedule the next call
      lock.lock();
    }
  }
  static int ThreadsNow() {
    int threads = 0;
    for ([[maybe_unused]] const auto& task :
         std::filesystem::directory_iterator("/proc/self/task")) {
      ++threads;
    }
    return threads;
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::multimap<absl::Time, Pending> due_;  // guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
  std::atomic<int> most_threads_{0};
  std::thread network_;  // last: it reads the members above
};

class ScheduledWorker : public WritingWorker {
 public:
  explicit ScheduledWorker(ScheduledWorkers* network) : network_(network) {}
  void AwaitSave(const std::string& directory, absl::Time deadline, AwaitSaveDone done) override {
    const int call = ++calls_;
    if (directory != kDirectory || call >= answer_at_call_) {
      v1::CommandResult result;
      result.set_rank(1);
      network_->Schedule(absl::Now(), result, std::move(done));
    } else {
      network_->Schedule(deadline, absl::DeadlineExceededError("async save still writing"),
                         std::move(done));
    }
  }

 private:
  ScheduledWorkers* network_;
};

TEST(AsyncSaveAwaitTest, AThousandRanksAreAwaitedWithoutAThreadEach) {
  constexpr int kRanks = 1024;
  ScheduledWorkers network;
  std::vector<std::shared_ptr<WorkerClient>> workers;
  for (int r = 0; r < kRanks; ++r) {
    auto worker = std::make_shared<ScheduledWorker>(&network);
    worker->write_moves_ = true;
    worker->answer_at_call_ = 3;
    workers.push_back(worker);
  }
  AwaitedSaves awaited =
      AwaitAsyncSaves(workers, kDirectory, absl::Now() + absl::Seconds(60), absl::Seconds(1), {},
                      [](int, const AwaitedSave&) { ADD_FAILURE(); });
  EXPECT_FALSE(awaited.stalled.has_value());
  ASSERT_EQ(awaited.ranks.size(), static_cast<size_t>(kRanks));
  for (size_t r = 0; r < awaited.ranks.size(); ++r) {
    ASSERT_TRUE(awaited.ranks[r].result.ok())
        << "rank " << r << ": " << awaited.ranks[r].result.status();
    EXPECT_EQ(static_cast<WritingWorker&>(*workers[r]).calls_.load(), 3) << "rank " << r;
  }
  EXPECT_GT(network.most_threads(), 0);
  EXPECT_LE(network.most_threads(), 8) << "threads while 1,024 writes were awaited";
}

}  // namespace
}  // namespace flatshard
