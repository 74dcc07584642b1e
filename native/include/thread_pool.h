// A persistent pool of worker threads for data-parallel loops over batch rows.
//
// Threads are created once and reused for every batch call: rebuilding a pool per call costs
// tens of microseconds of thread spawn and join, a fixed cost paid on every decode step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace constraints {

class ThreadPool {
 public:
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs fn(begin, end) over [0, n) in chunks of `grain` items, on the workers and the
  // calling thread, and returns when every chunk is done. One loop runs at a time; a second
  // caller waits. The first exception thrown by fn is rethrown here.
  void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }

  // The process-wide pool. Its size is CONSTRAINTS_THREADS if set, else the number of
  // hardware threads (at most 16).
  static ThreadPool& global();

 private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex submit_mutex_;  // serializes parallel_for callers
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t n_ = 0;
  size_t grain_ = 1;
  std::atomic<size_t> next_{0};
  size_t busy_ = 0;          // workers still inside the current job
  unsigned long generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace constraints
