#pragma once
// A small persistent thread pool for the reference ops: one parallel_for at a time splits a range
// into contiguous chunks, one per thread, so which thread computes an item never changes a
// result. A parallel_for issued from inside a worker, or while another is running, runs inline
// on the calling thread (no deadlock, no oversubscription).
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace duet {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads counts the caller, so n-1 workers are started
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end) over [0, n) split into at most size() chunks of at least min_chunk items.
  template <class Fn>
  void parallel_for(int64_t n, int64_t min_chunk, Fn&& fn) {
    auto trampoline = [](void* ctx, int64_t begin, int64_t end) {
      (*static_cast<Fn*>(ctx))(begin, end);
    };
    run(n, min_chunk, trampoline, &fn);
  }

 private:
  using Task = void (*)(void* ctx, int64_t begin, int64_t end);
  void run(int64_t n, int64_t min_chunk, Task task, void* ctx);
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex submit_mutex_;  // one parallel_for at a time; others run inline
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  Task task_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int n_chunks_ = 0;
};

}  // namespace duet
