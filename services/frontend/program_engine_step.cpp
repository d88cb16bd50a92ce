// ProgramEngine's step (program_engine.h): preparing a batch's token rows and page tables, ringing
// the device services and waiting for them, preemption and resumption, and recovery after a
// failed step.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/base/error.h"
#include "services/frontend/program_engine.h"
#include "services/frontend/program_engine_time.h"

namespace duet::frontend {
namespace {

using engine_time::Clock;
using engine_time::ns_of;
using engine_time::us_since;

struct TokenRow {
  int32_t token, pos, seq, logits_row;
};

}  // namespace

std::vector<float> ProgramEngine::step(const std::vector<SeqStep>& batch, StepStats* stats) {
  check_not_parked("step");
  const auto t0 = Clock::now();
  const Prepared prep = prepare(batch);
  phases_.prepare_us += us_since(t0);
  Parked work{{},        prep.bucket_index,  prep.args,          0,
              0,         prep.n_logits,      prep.args.n_tokens, prep.context,
              ns_of(t0), ns_of(Clock::now())};
  for (const SeqStep& s : batch)
    work.n_past.emplace_back(s.seq_id, s.pos0 + static_cast<int>(s.tokens.size()));
  return *execute(std::move(work), false, false, stats);
}

std::optional<std::vector<float>> ProgramEngine::step_preemptible(const std::vector<SeqStep>& batch,
                                                                  StepStats* stats) {
  if (!preemptible())
    throw Error(Errc::unsupported, "preemptible step: a device link does not support preemption");
  check_not_parked("step_preemptible");
  const auto t0 = Clock::now();
  const Prepared prep = prepare(batch);
  Parked work{{},        prep.bucket_index,  prep.args,          0,
              0,         prep.n_logits,      prep.args.n_tokens, prep.context,
              ns_of(t0), ns_of(Clock::now())};
  for (const SeqStep& s : batch)
    work.n_past.emplace_back(s.seq_id, s.pos0 + static_cast<int>(s.tokens.size()));
  return execute(std::move(work), true, false, stats);
}

std::optional<std::vector<float>> ProgramEngine::resume(StepStats* stats) {
  if (!parked_) throw Error(Errc::invalid_argument, "resume: no step is parked");
  Parked work = std::move(*parked_);
  parked_.reset();
  {
    // Its sequences are this step's again (held again if it is preempted again).
    std::lock_guard lock(kv_->mu);
    for (const auto& [id, n] : work.n_past) kv_->held.erase(id);
  }
  ++pstats_.resumes;
  return execute(std::move(work), true, true, stats);
}

bool ProgramEngine::preemptible() const {
  return gpu_->supports_preemption() && (!npu_ || npu_->supports_preemption());
}

void ProgramEngine::request_preempt() {
  // One publisher at a time, never moving the flag back (a completion flag is monotonic): tokens
  // only grow, so the running one read under the lock is >= anything published before.
  std::lock_guard lock(preempt_mu_);
  const uint64_t token = running_token_.load(std::memory_order_acquire);
  if (token == 0 || flags_.load(preempt_flag_) >= token) return;
  preempt_requested_ns_.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(),
      std::memory_order_relaxed);
  flags_.publish(preempt_flag_, token);
  // The step's wait reads the preempt flag with its epoch, after announcing itself a sleeper
  // (shm/completion_flag.h): it either sees the flag or is woken here.
  flags_.flag(awaited_flag_.load(std::memory_order_seq_cst)).wake_all();
}

size_t ProgramEngine::step_ops(uint32_t n_tokens) const {
  const BuiltPrograms& b = programs_[bucket_for(n_tokens).program];
  return b.gpu.ops.size() + b.npu.ops.size();
}

ProgramEngine::Prepared ProgramEngine::prepare(const std::vector<SeqStep>& batch) {
  if (batch.empty()) throw Error(Errc::invalid_argument, "empty step");
  if (batch.size() > options_.max_seqs)
    throw Error(Errc::invalid_argument, "a step of " + std::to_string(batch.size()) +
                                            " sequences exceeds " +
                                            std::to_string(options_.max_seqs));
  std::lock_guard lock(kv_->mu);
  uint32_t n_tokens = 0;
  int64_t context = 0;
  // Several consecutive entries of one sequence are applied in order (eval asks for every
  // position's logits that way): each may start at most where the previous one ended.
  std::map<uint64_t, int> n_past_in_step;
  bool decode = true;  // every entry a decode entry: the step runs the decode placement
  for (const SeqStep& s : batch) {
    decode = decode && s.decode;
    auto it = kv_->seqs.find(s.seq_id);
    if (it == kv_->seqs.end())
      throw Error(Errc::not_found, "sequence " + std::to_string(s.seq_id) + " is not open");
    kv_->check_not_held(s.seq_id, "step");
    if (s.tokens.empty()) throw Error(Errc::invalid_argument, "a step entry with no tokens");
    auto past = n_past_in_step.try_emplace(s.seq_id, it->second.n_past).first;
    if (s.pos0 < 0 || s.pos0 > past->second)
      throw Error(Errc::out_of_range, "sequence " + std::to_string(s.seq_id) +
                                          " would leave a gap at position " +
                                          std::to_string(past->second));
    past->second = s.pos0 + static_cast<int>(s.tokens.size());
    if (s.pos0 + static_cast<int>(s.tokens.size()) > it->second.max_positions)
      throw Error(Errc::out_of_range, "sequence " + std::to_string(s.seq_id) + " grows past its " +
                                          std::to_string(it->second.max_positions) + " positions");
    n_tokens += static_cast<uint32_t>(s.tokens.size());
    context = std::max<int64_t>(context, s.pos0);
  }
  const Bucket& bucket = bucket_for(n_tokens, decode);
  const size_t bucket_index = static_cast<size_t>(&bucket - buckets_.data());
  const BuiltPrograms& built = programs_[bucket.program];
  const int32_t n_vocab = model_->hp().n_vocab;
  for (const SeqStep& s : batch) {
    if (s.tokens.size() > 0)
      for (int32_t t : s.tokens)
        if (t < 0 || t >= n_vocab)
          throw Error(Errc::invalid_argument,
                      "token id " + std::to_string(t) + " outside the vocabulary");
    ensure_pages(s.seq_id, s.pos0 + static_cast<int>(s.tokens.size()));
  }

  // The step's symbol P: page-table columns for its longest sequence (a row of the tables is
  // written for every page up to it, and no further: the attention reads no further).
  uint32_t page_cols = 1;
  for (const SeqStep& s : batch)
    page_cols = std::max<uint32_t>(
        page_cols, (static_cast<uint32_t>(s.pos0) + static_cast<uint32_t>(s.tokens.size()) +
                    options_.page_tokens - 1) /
                       options_.page_tokens);
  // The step's token table and page tables, in the arena.
  auto* rows = reinterpret_cast<TokenRow*>(arena_seg_.data() + built.arena.tokens);
  auto* tables = reinterpret_cast<int32_t*>(arena_seg_.data() + built.arena.page_tables);
  uint32_t t = 0;
  int32_t n_logits = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqStep& s = batch[i];
    for (size_t j = 0; j < s.tokens.size(); ++j, ++t) {
      const bool last = j + 1 == s.tokens.size();
      rows[t] = {s.tokens[j], s.pos0 + static_cast<int32_t>(j), static_cast<int32_t>(i),
                 last && s.want_logits ? n_logits++ : -1};
    }
    const std::vector<uint32_t> pages = kv_->pages->pages_of(s.seq_id);
    // A shared page is read-only for every sharer (prefix sharing): the rows this entry writes
    // must all be in pages the sequence owns alone. Borrowed blocks are whole and complete, and
    // blocks are published only once written, so this holds by construction; checked here, where
    // the write is decided, because a broken page table would corrupt another request's KV.
    const auto first_page = static_cast<uint32_t>(s.pos0) / options_.page_tokens;
    const auto last_page = static_cast<uint32_t>(s.pos0 + static_cast<int>(s.tokens.size()) - 1) /
                           options_.page_tokens;
    for (uint32_t p = first_page; p <= last_page; ++p)
      if (p >= pages.size() || !kv_->pages->writable_by(pages[p], s.seq_id))
        throw Error(Errc::internal,
                    "sequence " + std::to_string(s.seq_id) + " would write positions " +
                        std::to_string(s.pos0) + "+ into KV page " +
                        (p < pages.size() ? std::to_string(pages[p]) : std::string("(none)")) +
                        ", which it does not own alone (shared or published)");
    kv_->record_tokens(s.seq_id, s.pos0, s.tokens);
    int32_t* row = tables + i * page_cols;
    for (uint32_t p = 0; p < page_cols; ++p)
      row[p] = p < pages.size() ? static_cast<int32_t>(pages[p]) : -1;
  }

  StepArgs args;
  args.n_tokens = n_tokens;
  args.n_seqs = static_cast<uint32_t>(batch.size());
  args.tokens_offset = built.arena.tokens;
  args.page_tables_offset = built.arena.page_tables;
  args.page_table_cols = page_cols;
  return Prepared{bucket_index, args, n_logits, context};
}

std::optional<std::vector<float>> ProgramEngine::execute(Parked work, bool preemptible,
                                                         bool resuming, StepStats* stats) {
  const auto t0 = Clock::now();
  const size_t bucket_index = work.bucket_index;
  const BuiltPrograms& built = programs_of(bucket_index);
  StepArgs args = work.args;
  const uint32_t n_tokens = work.n_tokens;
  const int32_t n_logits = work.n_logits;
  const int32_t n_vocab = model_->hp().n_vocab;

  // A device that died mid-step is restarted by the supervisor; the step is re-run under a new
  // seq once the device has its programs again. Re-running is exact: the token table, page tables
  // and KV rows of earlier positions are in shm, and this step rewrites its own KV rows with the
  // same values. Nothing before this step is recomputed.
  const auto give_up = Clock::now() + std::chrono::milliseconds(options_.recovery_timeout_ms);
  // A preempted step resumes under its own seq (its flags up to each device's stop are
  // published); a re-run after a failure starts over under a new seq.
  Attempt attempt;
  bool same_seq = resuming;
  for (;;) {
    if (!same_seq) {
      args.seq = ++step_seq_;
      work.gpu_next = work.npu_next = 0;
    }
    same_seq = false;
    try {
      attempt = run_on_devices(bucket_index, args, work.gpu_next, work.npu_next, preemptible);
      break;
    } catch (const Error& e) {
      const bool recoverable =
          e.code() == Errc::timeout || e.code() == Errc::unavailable || e.code() == Errc::not_found;
      if (!recoverable || Clock::now() > give_up) throw;
      last_failure_ = e.what();
      recover(give_up);
    }
  }
  const double wait_us = attempt.wait_us;
  const DeviceLink::Report& gpu_report = attempt.gpu;
  const DeviceLink::Report& npu_report = attempt.npu;
  pstats_.ops_executed += gpu_report.ops_run + npu_report.ops_run;
  flag_wait_us_ += wait_us;
  if (stats) {
    stats->measured_us = us_since(t0);
    // Modelled once per step, by the part that completes it (a preempted part's stats are not
    // counted by the frontend; its resume's are).
    stats->modeled_us =
        attempt.preempted ? 0 : modeled_step_us(bucket_index, n_tokens, work.context, n_logits);
    stats->flag_wait_us = wait_us;
    stats->kv_bytes_copied = 0;  // KV rows are written in place by the KvWrite op
    stats->n_tokens = n_tokens;
    StepDetail& d = stats->detail;
    d.engine = instance_;
    d.seq = args.seq;
    d.gpu_program = program_id(buckets_[bucket_index].program, true);
    d.npu_program = program_id(buckets_[bucket_index].program, false);
    d.on_gpu = attempt.on_gpu;
    d.on_npu = attempt.on_npu;
    d.bucket_tokens = buckets_[bucket_index].max_tokens;
    d.decode = buckets_[bucket_index].decode;
    d.n_tokens = n_tokens;
    d.n_seqs = args.n_seqs;
    d.logits_rows = static_cast<uint32_t>(n_logits);
    d.context = work.context;
    // A resumed step: its own start, not the parked step's.
    d.begin_ns = resuming ? ns_of(t0) : work.begin_ns;
    d.prepared_ns = resuming ? ns_of(t0) : work.prepared_ns;
    d.rung_ns = attempt.rung_ns;
    d.flags_ns = attempt.flags_ns;
    d.reports_ns = attempt.reports_ns;
    d.preempted = attempt.preempted;
  }
  if (attempt.preempted) {
    work.args = args;
    work.gpu_next = attempt.gpu_next;
    work.npu_next = attempt.npu_next;
    {
      std::lock_guard lock(kv_->mu);
      for (const auto& [id, n] : work.n_past) kv_->held.insert(id);
    }
    parked_ = std::move(work);
    ++pstats_.preemptions;
    if (stats) stats->detail.end_ns = ns_of(Clock::now());
    return std::nullopt;
  }

  {
    std::lock_guard lock(kv_->mu);
    for (const auto& [seq_id, n_past] : work.n_past) {
      auto it = kv_->seqs.find(seq_id);
      if (it != kv_->seqs.end()) it->second.n_past = n_past;
    }
    // Its complete blocks are in the KV now: publish them for later prompts to share.
    for (const auto& [seq_id, n_past] : work.n_past) kv_->publish_done(seq_id, n_past);
  }
  ++steps_;
  phases_.device_us += std::max(gpu_report.measured_us, npu_report.measured_us);
  const auto copy_start = Clock::now();
  const float* logits = reinterpret_cast<const float*>(arena_seg_.data() + built.arena.logits);
  std::vector<float> out(logits, logits + static_cast<size_t>(n_logits) * n_vocab);
  phases_.logits_us += us_since(copy_start);
  if (stats) stats->detail.end_ns = ns_of(Clock::now());
  return out;
}

ProgramEngine::Attempt ProgramEngine::run_on_devices(size_t bucket_index, StepArgs args,
                                                     uint32_t gpu_first, uint32_t npu_first,
                                                     bool preemptible) {
  const BuiltPrograms& built = programs_of(bucket_index);
  const size_t program = buckets_[bucket_index].program;
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.step_timeout_ms);
  const uint32_t gpu_ops = static_cast<uint32_t>(built.gpu.ops.size());
  const uint32_t npu_ops = static_cast<uint32_t>(built.npu.ops.size());
  // A device that already ran to the end before a preemption is not started again: its flags,
  // the done flag included, are published at this seq.
  const bool on_gpu = gpu_first < gpu_ops;
  const bool on_npu = npu_first < npu_ops;
  uint64_t token = 0;
  if (preemptible) {
    token = ++next_token_;
    args.preempt_flag = static_cast<int32_t>(preempt_flag_);
    args.preempt_token = token;
    running_token_.store(token, std::memory_order_release);
  }
  struct ClearToken {
    std::atomic<uint64_t>& t;
    ~ClearToken() { t.store(0, std::memory_order_release); }
  } clear_token{running_token_};
  // Devices wait under this epoch; one that starts the step after it moved on refuses it.
  const uint64_t epoch = flags_.epoch();
  args.epoch = epoch;
  const auto start_at = Clock::now();
  if (on_gpu) {
    args.first_op = gpu_first;
    gpu_->start_step(program_id(program, true), args);
  }
  if (on_npu) {
    args.first_op = npu_first;
    npu_->start_step(program_id(program, false), args);
  }
  phases_.start_us += us_since(start_at);
  Attempt a;
  a.on_gpu = on_gpu;
  a.on_npu = on_npu;
  a.rung_ns = ns_of(Clock::now());

  // Fast sync: the step is done when every device's last op has published its flag. A stack
  // epoch bump (the supervisor saw a service die) ends the wait at once; a device that reports a
  // failure ends it within a slice.
  const auto wait_start = Clock::now();
  shm::WaitStatus status = shm::WaitStatus::ready;
  // A preemptible step's wait also ends when the preempt flag reaches its token (request_preempt
  // wakes it): then the devices' reports (not the done flags) say where each stopped. 20 ms
  // slices that spin only in the first: waking often took CPU from the devices' threads on a
  // 2-core host (every 200 us: a 64-token step +0.5 ms).
  const auto slice = std::chrono::microseconds(20000);
  bool preempting = false;
  bool first_slice = true;
  for (uint32_t flag : built.done_flags) {
    for (;;) {
      shm::WaitOptions o;
      o.deadline = std::min(deadline, Clock::now() + slice);
      o.expected_epoch = epoch;
      if (!first_slice) o.spin_budget_ns = 0;
      first_slice = false;
      if (preemptible) {
        o.interrupt_word = &flags_.flag(preempt_flag_).seq;
        o.interrupt_at = token;
        awaited_flag_.store(flag, std::memory_order_seq_cst);
      }
      status = flags_.wait(flag, args.seq, o).status;
      if (status == shm::WaitStatus::interrupted) {
        preempting = true;
        break;
      }
      if (status != shm::WaitStatus::timeout || Clock::now() >= deadline) break;
      if ((on_gpu && gpu_->failed_early(args.seq)) || (on_npu && npu_->failed_early(args.seq)))
        break;
    }
    if (status != shm::WaitStatus::ready) break;
  }
  if (preempting) {
    if (on_gpu) a.gpu = gpu_->finish_step(args.seq, deadline);
    if (on_npu) a.npu = npu_->finish_step(args.seq, deadline);
    a.wait_us = us_since(wait_start);
    a.flags_ns = a.reports_ns = ns_of(Clock::now());
    a.gpu_next = on_gpu ? (a.gpu.preempted ? a.gpu.next_op : gpu_ops) : gpu_first;
    a.npu_next = on_npu ? (a.npu.preempted ? a.npu.next_op : npu_ops) : npu_first;
    a.preempted = a.gpu_next < gpu_ops || a.npu_next < npu_ops;
    if (a.preempted) {
      const int64_t asked = preempt_requested_ns_.load(std::memory_order_relaxed);
      const double latency_us =
          static_cast<double>(
              std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
                  .count() -
              asked) /
          1000.0;
      pstats_.last_latency_us = latency_us;
      pstats_.max_latency_us = std::max(pstats_.max_latency_us, latency_us);
    }
    return a;
  }
  if (status != shm::WaitStatus::ready) {
    // Abort the other device's waits on flags this step will never publish, so it is free for
    // the re-run at once.
    flags_.bump_epoch();
  }
  a.wait_us = us_since(wait_start);
  // The reports carry each device's times, and its error when a device failed. A device reports
  // right after its last flag: a report missing for a second means it was killed in between, and
  // the re-run (exact) beats waiting out the step deadline. After an epoch change the step is
  // re-run anyway and a killed device never reports: wait only briefly.
  const auto report_deadline =
      Clock::now() + (status == shm::WaitStatus::epoch_changed ? std::chrono::milliseconds(100)
                                                               : std::chrono::milliseconds(1000));
  phases_.flags_us += a.wait_us;
  const auto reports_at = Clock::now();
  a.flags_ns = ns_of(reports_at);
  if (on_gpu) a.gpu = gpu_->finish_step(args.seq, report_deadline);
  if (on_npu) a.npu = npu_->finish_step(args.seq, report_deadline);
  phases_.reports_us += us_since(reports_at);
  a.reports_ns = ns_of(Clock::now());
  a.gpu_next = gpu_ops;
  a.npu_next = npu_ops;
  if (status == shm::WaitStatus::epoch_changed)
    throw Error(Errc::unavailable, "step " + std::to_string(args.seq) +
                                       ": the stack epoch changed (a service restarted)");
  if (status != shm::WaitStatus::ready)
    throw Error(Errc::timeout, "step " + std::to_string(args.seq) + " did not complete in time");
  return a;
}

void ProgramEngine::recover(Clock::time_point give_up) {
  ++recoveries_;
  for (DeviceLink* link : {gpu_.get(), npu_.get()}) {
    if (!link) continue;
    for (;;) {
      try {
        reregister(*link);
        break;
      } catch (const Error&) {
        if (Clock::now() > give_up) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
}

}  // namespace duet::frontend
