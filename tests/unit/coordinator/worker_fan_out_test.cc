// The fan-outs put every call in flight at once and hold one thread for all
// of them: with 2,000 workers none of which has answered, the process has
// gained only the caller's thread, and each answer, whatever thread brings it
// and in whatever order, lands in its worker's place. A configure's failure
// is reported as it comes in, and no rank after it is started.
#include "coordinator/worker_fan_out.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"

#include "coordinator/grpc_worker_client.h"
#include "tests/unit/coordinator/unused_worker_client.h"

namespace flatshard {
namespace {

using ::testing::ElementsAre;

// The threads this process runs now.
int Threads() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// Every call's answer is held until the test gives it. (std::mutex: TSan
// does not see Debian's Abseil synchronize.)
struct Pending {
  std::mutex mu;
  std::condition_variable added;
  std::vector<std::function<void()>> answers;  // guarded by mu

  void Add(std::function<void()> answer) {
    std::lock_guard<std::mutex> lock(mu);
    answers.push_back(std::move(answer));
    added.notify_all();
  }
  // The first `n` held answers, once there are that many.
  std::vector<std::function<void()>> Take(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    added.wait(lock, [&] { return answers.size() == n; });
    return std::exchange(answers, {});
  }
};

class HeldWorker : public testing::UnusedWorkerClient {
 public:
  HeldWorker(int index, Pending* pending) : index_(index), pending_(pending) {}

  void GetStatusAsync(absl::Time, GetStatusDone done) override {
    pending_->Add([this, done = std::move(done)] {
      if (index_ % 7 == 0) {
        done(absl::UnavailableError("connection refused"));
        return;
      }
      v1::GetStatusResponse response;
      response.set_progress(static_cast<uint64_t>(index_));
      done(response);
    });
  }
  void AbortAsync(uint64_t epoch, const std::string& reason, absl::Time, AbortDone done) override {
    pending_->Add([this, epoch, reason, done = std::move(done)] {
      done(index_ % 5 == 0 ? absl::FailedPreconditionError(reason + " " + std::to_string(epoch))
                           : absl::OkStatus());
    });
  }
  void ConfigureAsync(v1::ConfigureRequest request, absl::Time connect_by, absl::Time,
                      ConfigureDone done) override {
    connect_by_ = connect_by;
    pending_->Add([this, request = std::move(request), done = std::move(done)] {
      done(request.rank() == index_ && request.job() == "fan-out"
               ? absl::OkStatus()
               : absl::InvalidArgumentError("rank " + std::to_string(request.rank())));
    });
  }
  std::string address() const override { return "held:" + std::to_string(index_); }
  absl::Time connect_by() const { return connect_by_; }

 private:
  absl::Time connect_by_;
  const int index_;
  Pending* const pending_;
};

constexpr int kWorkers = 2000;

class WorkerFanOutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < kWorkers; ++i) {
      owned_.push_back(std::make_unique<HeldWorker>(i, &pending_));
      workers_.push_back(owned_.back().get());
    }
  }

  // Waits until all kWorkers calls are in flight, notes the threads then,
  // and answers them from two threads, back to front.
  int AnswerAllOnceInFlight() {
    std::vector<std::function<void()>> answers = pending_.Take(kWorkers);
    const int threads = Threads();
    std::thread odd([&] {
      for (size_t i = answers.size(); i-- > 0;) {
        if (i % 2 == 1) answers[i]();
      }
    });
    for (size_t i = answers.size(); i-- > 0;) {
      if (i % 2 == 0) answers[i]();
    }
    odd.join();
    return threads;
  }

  Pending pending_;
  std::vector<std::unique_ptr<HeldWorker>> owned_;
  std::vector<WorkerClient*> workers_;
};

TEST_F(WorkerFanOutTest, EveryProbeIsInFlightAtOnceOnOneThread) {
  const int before = Threads();
  std::vector<absl::StatusOr<v1::GetStatusResponse>> answers;
  std::thread prober([&] { answers = GetStatusAll(workers_, absl::Now() + absl::Seconds(1)); });
  const int during = AnswerAllOnceInFlight();
  prober.join();
  // The prober (and, under ThreadSanitizer, its runtime's own thread, which
  // starts when the first thread does): a thread each would be 2,000 more.
  EXPECT_LE(during, before + 2);
  ASSERT_EQ(answers.size(), static_cast<size_t>(kWorkers));
  for (int i = 0; i < kWorkers; ++i) {
    if (i % 7 == 0) {
      EXPECT_EQ(answers[static_cast<size_t>(i)].status().code(), absl::StatusCode::kUnavailable)
          << i;
    } else {
      ASSERT_TRUE(answers[static_cast<size_t>(i)].ok()) << i;
      EXPECT_EQ(answers[static_cast<size_t>(i)]->progress(), static_cast<uint64_t>(i));
    }
  }
}

TEST_F(WorkerFanOutTest, EveryAbortIsInFlightAtOnceOnOneThread) {
  const int before = Threads();
  std::vector<absl::Status> outcomes;
  std::thread aborter(
      [&] { outcomes = AbortAll(workers_, 9, "rank 3 died", absl::Now() + absl::Seconds(1)); });
  const int during = AnswerAllOnceInFlight();
  aborter.join();
  EXPECT_LE(during, before + 2);
  ASSERT_EQ(outcomes.size(), static_cast<size_t>(kWorkers));
  for (int i = 0; i < kWorkers; ++i) {
    const absl::Status& s = outcomes[static_cast<size_t>(i)];
    if (i % 5 == 0) {
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << i;
      EXPECT_EQ(s.message(), "rank 3 died 9") << i;
    } else {
      EXPECT_TRUE(s.ok()) << i << ": " << s;
    }
  }
}

TEST_F(WorkerFanOutTest, EveryConfigureIsInFlightAtOnceOnOneThreadWithItsOwnRequest) {
  std::vector<v1::ConfigureRequest> requests(kWorkers);
  for (int i = 0; i < kWorkers; ++i) {
    requests[static_cast<size_t>(i)].set_job("fan-out");
    requests[static_cast<size_t>(i)].set_rank(i);
  }
  const int before = Threads();
  std::vector<absl::Status> outcomes;
  const absl::Time start = absl::Now();
  std::thread configurer(
      [&] { outcomes = ConfigureAll(workers_, std::move(requests), start + absl::Hours(1), {}); });
  const int during = AnswerAllOnceInFlight();
  configurer.join();
  EXPECT_LE(during, before + 2);
  // The connect grace grows with the burst: 2,000 channels are not all
  // connected, and their calls made, sent and answered, within the grace one
  // call is given.
  const absl::Duration grace = FanOutTimeout(kConnectGrace, kWorkers, FanOutChannels::kConnecting);
  EXPECT_EQ(grace, kConnectGrace + (kWorkers - 1) * kConnectAllowancePerCall);
  EXPECT_GE(owned_.back()->connect_by(), start + grace);
  EXPECT_LE(owned_.back()->connect_by(), absl::Now() + grace);
  ASSERT_EQ(outcomes.size(), static_cast<size_t>(kWorkers));
  for (int i = 0; i < kWorkers; ++i) EXPECT_TRUE(outcomes[static_cast<size_t>(i)].ok()) << i;
}

// A rendezvous: a rank's Configure is held until every rank has arrived, so
// here until it is cancelled; one rank refuses as its call starts. A sticky
// cancel also answers a call started after it (so that a rank started when
// it should not have been is counted, not left waiting); GrpcWorkerClient's
// is not sticky: it cancels the calls in flight.
class RendezvousWorker final : public HeldWorker {
 public:
  RendezvousWorker(int index, bool refuses, bool sticky, int* started)
      : HeldWorker(index, nullptr), refuses_(refuses), sticky_(sticky), started_(started) {}
  void ConfigureAsync(v1::ConfigureRequest, absl::Time, absl::Time, ConfigureDone done) override {
    ++*started_;
    if (before_registering) before_registering();
    if (refuses_) {
      done(absl::InvalidArgumentError("no such device"));
      return;
    }
    if (cancelled_) {
      done(absl::CancelledError("cancelled"));
      return;
    }
    held_ = std::move(done);
  }
  void CancelAll() override {
    cancelled_ = sticky_;
    if (held_) std::exchange(held_, nullptr)(absl::CancelledError("cancelled"));
  }

  std::function<void()> before_registering;

 private:
  const bool refuses_;
  const bool sticky_;
  int* const started_;
  bool cancelled_ = false;
  ConfigureDone held_;
};

TEST_F(WorkerFanOutTest, AFailedConfigureIsReportedAsItComesInAndStartsNoMoreRanks) {
  int started = 0;
  std::vector<std::unique_ptr<RendezvousWorker>> owned;
  std::vector<WorkerClient*> ranks;
  for (int i = 0; i < 4; ++i) {
    owned.push_back(
        std::make_unique<RendezvousWorker>(i, /*refuses=*/i == 2, /*sticky=*/true, &started));
    ranks.push_back(owned.back().get());
  }
  std::vector<std::string> reported;
  // As a formation does: the first failure cancels the ranks waiting at the
  // rendezvous (reentrantly here: the cancelled answer comes on this thread).
  const std::vector<absl::Status> outcomes = ConfigureAll(
      ranks, std::vector<v1::ConfigureRequest>(4), absl::Now() + absl::Seconds(1),
      [&](size_t rank, const absl::Status& status) {
        reported.push_back(std::to_string(rank) + ": " + std::string(status.message()));
        if (reported.size() == 1) {
          for (WorkerClient* other : ranks) other->CancelAll();
        }
      });
  EXPECT_EQ(started, 3);  // rank 3 came after the failure
  EXPECT_THAT(reported, ElementsAre("2: no such device", "0: cancelled", "1: cancelled"));
  ASSERT_EQ(outcomes.size(), 4u);
  EXPECT_EQ(outcomes[0].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(outcomes[1].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(outcomes[2].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(outcomes[3].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(outcomes[3].message(), "not configured: the formation ended first");
}

// A formation ended by another cause (Stop, a silent worker) while its calls
// are being started: the caller cancels every client, but a call registered
// just after that cancel is not reached by it, and ConfigureAll cancels it.
TEST_F(WorkerFanOutTest, AFormationAbandonedMeanwhileCancelsTheRankBeingStartedAndStartsNoMore) {
  int started = 0;
  std::vector<std::unique_ptr<RendezvousWorker>> owned;
  std::vector<WorkerClient*> ranks;
  for (int i = 0; i < 4; ++i) {
    owned.push_back(
        std::make_unique<RendezvousWorker>(i, /*refuses=*/false, /*sticky=*/false, &started));
    ranks.push_back(owned.back().get());
  }
  std::atomic<bool> abandoned{false};
  // The stop comes while rank 1's call is being started, before it is
  // registered: it abandons, then cancels every client.
  owned[1]->before_registering = [&] {
    abandoned = true;
    for (WorkerClient* rank : ranks) rank->CancelAll();
  };
  std::future<std::vector<absl::Status>> configured = std::async(std::launch::async, [&] {
    return ConfigureAll(
        ranks, std::vector<v1::ConfigureRequest>(4), absl::Now() + absl::Seconds(1),
        [](size_t, const absl::Status&) {}, [&] { return abandoned.load(); });
  });
  if (configured.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    ADD_FAILURE() << "rank 1's call was left waiting after the formation was abandoned";
    for (WorkerClient* rank : ranks) rank->CancelAll();
  }
  const std::vector<absl::Status> outcomes = configured.get();
  EXPECT_EQ(started, 2);
  ASSERT_EQ(outcomes.size(), 4u);
  for (const absl::Status& s : outcomes) EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_EQ(outcomes[2].message(), "not configured: the formation ended first");
}

// One that answers on the caller's thread, before its call returns (as a
// client does for a call that cannot start).
class InlineWorker final : public HeldWorker {
 public:
  using HeldWorker::HeldWorker;
  void GetStatusAsync(absl::Time, GetStatusDone done) override {
    done(absl::UnavailableError("cannot start"));
  }
};

TEST_F(WorkerFanOutTest, AnswersBeforeTheCallReturnsAndNoWorkersAtAll) {
  EXPECT_TRUE(GetStatusAll({}, absl::Now()).empty());
  EXPECT_TRUE(AbortAll({}, 1, "none", absl::Now()).empty());
  EXPECT_TRUE(ConfigureAll({}, {}, absl::Now(), {}).empty());
  EXPECT_EQ(FanOutTimeout(absl::Seconds(1), 0), absl::Seconds(1));
  EXPECT_EQ(FanOutTimeout(absl::Seconds(1), 1), absl::Seconds(1));
  EXPECT_EQ(FanOutTimeout(absl::Seconds(1), 3), absl::Seconds(1) + 2 * kFanOutAllowancePerCall);
  EXPECT_EQ(FanOutTimeout(absl::Seconds(1), 3, FanOutChannels::kConnecting),
            absl::Seconds(1) + 2 * kConnectAllowancePerCall);
  EXPECT_GT(kConnectAllowancePerCall, kFanOutAllowancePerCall);
  // A channel stays connected through a fan-out over its whole job.
  EXPECT_EQ(WorkerChannelIdle(1), kWorkerChannelIdle);
  EXPECT_EQ(WorkerChannelIdle(16384),
            FanOutTimeout(kWorkerChannelIdle, 16384, FanOutChannels::kConnecting));

  InlineWorker inline_worker(1, &pending_);
  std::vector<WorkerClient*> mixed = {workers_[3], &inline_worker, workers_[4]};
  // Answers the next `n` calls once they are all in flight.
  const auto answer = [&](size_t n) {
    return std::thread([this, n] {
      for (auto& a : pending_.Take(n)) a();
    });
  };
  // The blocking GetStatus waits for the same asynchronous call.
  std::thread answerer = answer(1);
  absl::StatusOr<v1::GetStatusResponse> one = workers_[5]->GetStatus(absl::Now());
  answerer.join();
  answerer = answer(2);  // the inline one is answered already
  const std::vector<absl::StatusOr<v1::GetStatusResponse>> answers =
      GetStatusAll(mixed, absl::Now());
  answerer.join();
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->progress(), 5u);
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[0]->progress(), 3u);
  EXPECT_EQ(answers[1].status().message(), "cannot start");
  EXPECT_EQ(answers[2]->progress(), 4u);
}

}  // namespace
}  // namespace flatshard
