#include "core/base/thread_pool.h"

#include <algorithm>

namespace duet {
namespace {
thread_local bool t_inside_pool_worker = false;

void chunk_bounds(int64_t n, int n_chunks, int index, int64_t* begin, int64_t* end) {
  *begin = n * index / n_chunks;
  *end = n * (index + 1) / n_chunks;
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run(int64_t n, int64_t min_chunk, Task task, void* ctx) {
  if (n <= 0) return;
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int n_chunks = static_cast<int>(std::min<int64_t>(n_threads_, max_chunks));
  std::unique_lock submit(submit_mutex_, std::try_to_lock);
  if (n_chunks == 1 || t_inside_pool_worker || !submit.owns_lock()) {
    task(ctx, 0, n);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    task_ = task;
    ctx_ = ctx;
    n_ = n;
    n_chunks_ = n_chunks;
    pending_ = n_chunks - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  int64_t begin = 0, end = 0;
  chunk_bounds(n, n_chunks, 0, &begin, &end);
  t_inside_pool_worker = true;
  task(ctx, begin, end);
  t_inside_pool_worker = false;
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
}

void ThreadPool::worker_loop(int index) {
  t_inside_pool_worker = true;
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock lock(mutex_);
    work_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    if (index >= n_chunks_) continue;
    const Task task = task_;
    void* ctx = ctx_;
    int64_t begin = 0, end = 0;
    chunk_bounds(n_, n_chunks_, index, &begin, &end);
    lock.unlock();
    task(ctx, begin, end);
    lock.lock();
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

}  // namespace duet
