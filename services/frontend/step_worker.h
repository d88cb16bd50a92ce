#pragma once
// What the in-process device links share (interpreter_link.cpp, local_service_link.cpp): a
// thread that runs one step's work at a time, so that start_step returns at once and
// finish_step waits for the outcome until a deadline, as a link to a service process does.
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "core/base/error.h"

namespace duet::frontend {

template <class Outcome>
class StepWorker {
 public:
  using Clock = std::chrono::steady_clock;

  // `link` names the device in errors.
  explicit StepWorker(std::string link) : link_(std::move(link)), thread_([this] { loop(); }) {}
  ~StepWorker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  StepWorker(const StepWorker&) = delete;
  StepWorker& operator=(const StepWorker&) = delete;

  // Hands the thread the next step's work, and forgets the last step's outcome.
  void start(std::function<Outcome()> work) {
    std::lock_guard lock(mu_);
    work_ = std::move(work);
    outcome_.reset();
    error_ = nullptr;
    cv_.notify_all();
  }

  // Calls fn while no step's work starts on the thread and no outcome lands (a step's work that
  // is already running runs on).
  template <class Fn>
  decltype(auto) between_steps(Fn&& fn) {
    std::lock_guard lock(mu_);
    return fn();
  }

  // Without blocking: has the work thrown, or ended with an outcome `is_failure` says failed?
  bool failed(const std::function<bool(const Outcome&)>& is_failure) {
    std::lock_guard lock(mu_);
    return error_ != nullptr || (outcome_.has_value() && is_failure(*outcome_));
  }

  // The work's outcome once it ends, or what it threw; Error(timeout) at the deadline.
  Outcome finish(uint64_t step_seq, Clock::time_point deadline) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return outcome_.has_value() || error_; }))
      throw Error(Errc::timeout,
                  link_ + ": step " + std::to_string(step_seq) + " did not report in time");
    if (error_) std::rethrow_exception(error_);
    Outcome outcome = std::move(*outcome_);
    outcome_.reset();
    return outcome;
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || work_ != nullptr; });
      if (stop_) return;
      std::function<Outcome()> work = std::move(work_);
      work_ = nullptr;
      lock.unlock();
      std::optional<Outcome> outcome;
      std::exception_ptr error;
      try {
        outcome.emplace(work());
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (error)
        error_ = error;
      else
        outcome_ = std::move(outcome);
      cv_.notify_all();
    }
  }

  std::string link_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::function<Outcome()> work_;
  std::optional<Outcome> outcome_;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace duet::frontend
