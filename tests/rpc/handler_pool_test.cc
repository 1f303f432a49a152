// HandlerPool on the host: round robin over connections' queues, Shutdown running what is
// queued, the spinner catching tasks that come within its budget (and not when they come
// sparser, or with no spin), Shutdown not waiting out a spin, and every task of a burst from
// several threads run exactly once.
#include "rpc/server/handler_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace {

using zrpc::internal::HandlerPool;
using zrpc::internal::PoolQueue;
using zrpc::internal::PoolTask;

class Task final : public PoolTask {
 public:
  explicit Task(std::function<void()> body) : body_(std::move(body)) {}
  void Run() override {
    body_();
    done_.Notify();
  }
  void Wait() { done_.WaitForNotification(); }
  bool done() const { return done_.HasBeenNotified(); }

 private:
  std::function<void()> body_;
  absl::Notification done_;
};

TEST_CASE("a pool takes connections' queues in turn, each queue in order", "[handler_pool]") {
  HandlerPool pool(1);
  PoolQueue a, b;
  absl::Notification release;
  std::mutex mu;
  std::vector<std::string> order;
  auto record = [&](std::string name) {
    return [&, name] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(name);
    };
  };
  absl::Notification started;
  Task blocker([&] {
    started.Notify();
    release.WaitForNotification();
  });
  pool.Submit(a, &blocker);  // holds the one thread while the rest queue up
  started.WaitForNotification();
  Task a1(record("a1")), a2(record("a2")), a3(record("a3")), b1(record("b1")), b2(record("b2"));
  pool.Submit(a, &a1);
  pool.Submit(a, &a2);
  pool.Submit(a, &a3);
  pool.Submit(b, &b1);
  pool.Submit(b, &b2);
  release.Notify();
  a3.Wait();
  b2.Wait();
  // a (emptied by its blocker) came back first, then b: a1, b1, a2, b2, a3. A flood on a delays
  // b by one task at each turn, not by the flood.
  CHECK(order == std::vector<std::string>{"a1", "b1", "a2", "b2", "a3"});
}

TEST_CASE("Shutdown runs what is queued; a task submitted after it runs on the caller",
          "[handler_pool]") {
  auto pool = std::make_unique<HandlerPool>(1, absl::Milliseconds(10));
  PoolQueue queue;
  absl::Notification release;
  Task blocker([&] { release.WaitForNotification(); });
  std::atomic<int> ran{0};
  std::vector<std::unique_ptr<Task>> tasks;
  pool->Submit(queue, &blocker);
  for (int i = 0; i < 10; ++i) {
    tasks.push_back(std::make_unique<Task>([&] { ran++; }));
    pool->Submit(queue, tasks.back().get());
  }
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(50));
    release.Notify();
  });
  pool->Shutdown();
  releaser.join();
  CHECK(ran == 10);
  Task late([&] { ran++; });
  pool->Submit(queue, &late);
  CHECK(late.done());
  CHECK(ran == 11);
}

// Tasks submitted one at a time, `gap` after the last one ended, to a pool with `spin`: what the
// spinner caught (printed).
HandlerPool::Stats Trickle(absl::Duration spin, int count, absl::Duration gap) {
  HandlerPool pool(2, spin);
  PoolQueue queue;
  for (int i = 0; i < count; ++i) {
    Task task([] {});
    pool.Submit(queue, &task);
    task.Wait();
    absl::SleepFor(gap);
  }
  const HandlerPool::Stats stats = pool.stats();
  std::printf("spin %s, tasks %s apart: %lu of %lu caught while polling\n",
              absl::FormatDuration(spin).c_str(), absl::FormatDuration(gap).c_str(),
              static_cast<unsigned long>(stats.caught_spinning),
              static_cast<unsigned long>(stats.tasks));
  return stats;
}

TEST_CASE("an idle worker polls for the next task while tasks come within its spin",
          "[handler_pool]") {
  HandlerPool::Stats stats = Trickle(absl::Seconds(1), 40, absl::Milliseconds(1));
  CHECK(stats.tasks == 40);
  CHECK(stats.caught_spinning >= 20);  // none without the spin (below); most with it
  // Sparser than the spin: after the first gap the spinner parks at once.
  stats = Trickle(absl::Milliseconds(5), 10, absl::Milliseconds(30));
  CHECK(stats.tasks == 10);
  CHECK(stats.caught_spinning <= 2);
  // No spin: every task wakes a parked worker.
  stats = Trickle(absl::ZeroDuration(), 10, absl::Milliseconds(1));
  CHECK(stats.tasks == 10);
  CHECK(stats.caught_spinning == 0);
}

TEST_CASE("Shutdown does not wait out a spinning worker's budget", "[handler_pool]") {
  HandlerPool pool(2, absl::Seconds(1));
  PoolQueue queue;
  Task task([] {});
  pool.Submit(queue, &task);
  task.Wait();  // a worker now polls for the next task: before any gap, for the whole second
  absl::SleepFor(absl::Milliseconds(1));
  const absl::Time start = absl::Now();
  pool.Shutdown();
  CHECK(absl::Now() - start < absl::Milliseconds(500));
}

TEST_CASE("a burst from several threads over many queues: every task runs once", "[handler_pool]") {
  constexpr int kThreads = 4;
  constexpr int kQueues = 8;
  constexpr int kPerThread = 2000;
  HandlerPool pool(3, absl::Microseconds(200));
  std::vector<PoolQueue> queues(kQueues);
  std::vector<std::atomic<int>> runs(kThreads * kPerThread);
  std::vector<std::unique_ptr<Task>> tasks(kThreads * kPerThread);
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    tasks[i] = std::make_unique<Task>([&runs, i] { runs[i]++; });
  }
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t) {
    submitters.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int index = t * kPerThread + i;
        // Each queue has one submitting thread at a time: the pool's contract (a connection's
        // queue is fed by its poller).
        pool.Submit(queues[t * 2 + i % 2], tasks[index].get());
        if (i % 64 == 0) std::this_thread::yield();
      }
    });
  }
  for (auto& thread : submitters) thread.join();
  for (auto& task : tasks) task->Wait();
  int wrong = 0;
  for (auto& count : runs) wrong += count.load() != 1;
  CHECK(wrong == 0);
  CHECK(pool.stats().tasks == static_cast<uint64_t>(kThreads * kPerThread));
}

}  // namespace
