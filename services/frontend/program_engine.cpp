// ProgramEngine's registration and state: the shm segments' names, building and registering the
// programs with the device services (again after a restart), the token buckets, and status. The
// step is in program_engine_step.cpp, the programs in program_engine_build.cpp.
#include "services/frontend/program_engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/base/error.h"
#include "services/frontend/program_engine_time.h"

namespace duet::frontend {
namespace {

using engine_time::Clock;
using engine_time::us_since;

std::atomic<uint64_t> g_engines{0};

std::string tagged(const std::string& stack, const char* what, const std::string& tag) {
  return shm::segment_name(stack, tag.empty() ? std::string(what) : std::string(what) + "." + tag);
}

}  // namespace

std::string ProgramEngine::arena_name(const std::string& stack, const std::string& tag) {
  return tagged(stack, "arena", tag);
}
std::string ProgramEngine::kv_name(const std::string& stack, const std::string& tag) {
  return tagged(stack, "kv", tag);
}
std::string ProgramEngine::flags_name(const std::string& stack, const std::string& tag) {
  return tagged(stack, "flags", tag);
}

ProgramEngine::ProgramEngine(ProgramEngineOptions options, std::unique_ptr<LlamaModel> model,
                             std::unique_ptr<DeviceLink> gpu, std::unique_ptr<DeviceLink> npu)
    : options_(std::move(options)),
      instance_(++g_engines),
      model_(std::move(model)),
      gpu_(std::move(gpu)),
      npu_(std::move(npu)) {
  if (!model_ || !gpu_)
    throw Error(Errc::invalid_argument, "program engine: needs a model and a GPU");
  if (options_.buckets.empty())
    throw Error(Errc::invalid_argument, "program engine: no token buckets");
  std::sort(options_.buckets.begin(), options_.buckets.end());
  if (!options_.soc.empty()) {
    soc_ = load_soc_profile(options_.soc);
    soc_options_ = solver_options_for(*soc_);
    soc_options_.soc = &*soc_;  // online-prepare's compile cost
  }
  const LlamaHparams& hp = model_->hp();
  const uint32_t max_ctx = options_.max_ctx ? options_.max_ctx : static_cast<uint32_t>(hp.n_ctx);
  options_.max_ctx = max_ctx;
  max_pages_per_seq_ = (max_ctx + options_.page_tokens - 1) / options_.page_tokens;
  const uint32_t n_pages =
      options_.kv_pages ? options_.kv_pages : max_pages_per_seq_ * options_.max_seqs;
  if (options_.kv_type != DType::F32 && options_.kv_type != DType::F16 &&
      options_.kv_type != DType::Q8_0)
    throw Error(Errc::unsupported, "program engine: KV values of type " +
                                       std::string(dtype_name(options_.kv_type)) +
                                       " (f32, f16 or q8_0)");
  const uint64_t page_bytes =
      uint64_t{static_cast<uint32_t>(hp.n_layer)} * 2 * options_.page_tokens *
      kv_row_bytes(options_.kv_type, static_cast<uint32_t>(hp.n_head_kv * hp.head_dim));

  // A frontend that crashed left its segments behind: this engine owns those names, so it removes
  // them (services holding the old mappings re-map when the programs are registered again).
  // (The KV pool is removed by whoever makes it anew, or adopted: attach_kv.)
  for (const std::string& name : {arena_name(options_.stack_id, options_.segment_tag),
                                  flags_name(options_.stack_id, options_.segment_tag)}) {
    try {
      shm::Segment::open(name).unlink();
    } catch (const Error&) {
    }
  }
  // KV pages first: the programs need where page 0 starts.
  // The segments this constructor creates are its to remove if it fails half way (a device
  // refused a program, say): a throwing constructor runs no destructor.
  try {
    attach_kv(n_pages, page_bytes);

    build_programs_and_buckets(max_ctx, n_pages);
    uint64_t arena_bytes = 0;
    uint32_t n_flags = 0;
    for (const BuiltPrograms& p : programs_) {
      arena_bytes = std::max(arena_bytes, p.arena.bytes);
      n_flags = std::max(n_flags, p.n_flags);
    }
    registration_.arena_bytes = arena_bytes;
    arena_seg_ =
        shm::Segment::create(arena_name(options_.stack_id, options_.segment_tag), arena_bytes);
    // One flag past the programs' own: the preempt word (see request_preempt).
    preempt_flag_ = n_flags;
    // Past it, each device's step doorbell: two flags (ring, report) and a slot of the doorbell
    // region after the table (shm/doorbell.h: RunStep through shm, not ZeroMQ).
    const uint32_t doorbell_flag = n_flags + 1, n_table_flags = n_flags + 5;
    const uint64_t region_offset = (shm::FlagTable::bytes_for(n_table_flags) + 63) / 64 * 64;
    flags_seg_ = shm::Segment::create(flags_name(options_.stack_id, options_.segment_tag),
                                      region_offset + shm::DoorbellRegion::bytes_for(2));
    flags_ = shm::FlagTable::format(flags_seg_.data(), region_offset, n_table_flags);
    const shm::DoorbellRegion doorbells = shm::DoorbellRegion::format(
        flags_seg_.data() + region_offset, flags_seg_.size() - region_offset, 2,
        shm::new_doorbell_instance());
    for (uint32_t slot = 0; slot < 2; ++slot) {
      DeviceLink* link = slot == 0 ? gpu_.get() : npu_.get();
      if (!link || !link->wants_doorbell()) continue;
      const shm::DoorbellRef ref{doorbell_flag + 2 * slot, doorbell_flag + 2 * slot + 1,
                                 region_offset, slot, doorbells.instance()};
      link->attach_doorbell(shm::DoorbellBell(flags_, doorbells, ref));
      for (BuiltPrograms& b : programs_) {
        fb::ProgramT& mine = slot == 0 ? b.gpu : b.npu;
        mine.doorbell = std::make_unique<fb::DoorbellRef>(
            ref.ring_flag, ref.report_flag, ref.region_offset, ref.slot, ref.instance,
            doorbell_hold_flag(mine, slot == 0 ? b.npu : b.gpu));
      }
    }

    const auto register_start = Clock::now();
    reregister(*gpu_);
    if (npu_) reregister(*npu_);
    registration_.register_ms = us_since(register_start) / 1000.0;
    for (const BuiltPrograms& p : programs_) {
      registration_.programs += p.gpu.ops.empty() ? 0 : 1;
      registration_.registered += (p.gpu.ops.empty() ? 0 : 1) + (p.npu.ops.empty() ? 0 : 1);
    }
  } catch (...) {
    // (The KV pool, if this engine made it, goes with kv_: its last holder removes it.)
    for (shm::Segment* seg : {&arena_seg_, &flags_seg_}) {
      try {
        if (seg->valid()) seg->unlink();
      } catch (...) {
      }
    }
    throw;
  }
}

ProgramEngine::~ProgramEngine() {
  // This engine created the data plane; it removes it (the KV pool: its last holder). Mappings
  // held elsewhere stay valid.
  for (shm::Segment* s : {&arena_seg_, &flags_seg_}) {
    try {
      if (s->valid()) s->unlink();
    } catch (...) {
    }
  }
}

void ProgramEngine::reregister(DeviceLink& device) {
  const bool is_gpu = &device == gpu_.get();
  for (size_t i = 0; i < programs_.size(); ++i) {
    const fb::ProgramT& p = is_gpu ? programs_[i].gpu : programs_[i].npu;
    if (!p.ops.empty()) device.register_program(program_id(i, is_gpu), p);
  }
}

ProgramMemory ProgramEngine::memory() const {
  return {arena_seg_.data(),   arena_seg_.size(),     kv_->segment.data(),
          kv_->segment.size(), model_->file().data(), model_->file().size()};
}

const ProgramEngine::Bucket& ProgramEngine::bucket_for(uint32_t n_tokens, bool decode) const {
  // Decode buckets exist only with a decode placement; without, decode steps run the others.
  const bool phase = decode && buckets_.back().decode;
  for (const Bucket& b : buckets_)
    if (b.decode == phase && n_tokens <= b.max_tokens) return b;
  throw Error(Errc::invalid_argument, "a step of " + std::to_string(n_tokens) +
                                          " tokens exceeds the largest bucket (" +
                                          std::to_string(buckets_.back().max_tokens) + ")");
}

const char* ProgramEngine::phase_of(const Bucket& b) const {
  return b.decode ? "decode" : buckets_.back().decode ? "prefill" : "any";
}

void ProgramEngine::check_not_parked(const char* what) const {
  if (parked_)
    throw Error(Errc::busy, std::string(what) +
                                ": a preempted step is parked on this engine (resume it first)");
}

nlohmann::json ProgramEngine::status() const {
  nlohmann::json buckets = nlohmann::json::array();
  for (const Bucket& b : buckets_)
    buckets.push_back({{"max_tokens", b.max_tokens},
                       {"phase", phase_of(b)},
                       {"plan", b.plan.name},
                       {"soc_plan", b.soc_plan.name},
                       {"program", b.program},
                       {"gpu_ops", programs_[b.program].gpu.ops.size()},
                       {"npu_ops", programs_[b.program].npu.ops.size()}});
  nlohmann::json programs = nlohmann::json::array();
  for (const BuiltPrograms& p : programs_)
    programs.push_back({{"max_tokens", p.gpu.max_tokens},
                        {"arena_slots", p.arena.slot_offset.size()},
                        {"arena_tensors", p.arena.tensors},
                        {"arena_bytes", p.arena.bytes},
                        {"arena_end", p.arena.end.str()}});
  std::lock_guard lock(kv_->mu);
  const shm::KvPages::Counts counts = kv_->pages->counts();
  return {{"engine", "programs"},
          {"plan", options_.plan_name},
          {"soc", soc_ ? nlohmann::json(soc_->name) : nlohmann::json(nullptr)},
          {"buckets", buckets},
          {"programs", programs},
          {"programs_mode", options_.per_bucket_programs ? "per-bucket" : "symbolic"},
          {"registration",
           {{"programs", registration_.programs},
            {"register_calls", registration_.registered},
            {"build_ms", registration_.build_ms},
            {"register_ms", registration_.register_ms},
            {"arena_bytes", registration_.arena_bytes}}},
          {"kv_segment", kv_->name},
          {"kv_shared", options_.kv_share != nullptr},
          {"kv_pages_total", kv_->pages->n_pages()},
          // free: no live sequence holds them (cached prefix blocks among them, reclaimed on
          // demand); used: held or borrowed by live sequences; shared: borrowed by at least one
          // sequence besides its writer (issue 20 item 4).
          {"kv_pages_free", counts.free + counts.cached},
          {"kv_pages_used", counts.used},
          {"kv_pages_cached", counts.cached},
          {"kv_pages_shared", counts.shared},
          {"kv_prefix_sharing", kv_->sharing},
          {"kv_prefix",
           {{"lookups", kv_->prefix.lookups},
            {"hits", kv_->prefix.hits},
            {"hit_blocks", kv_->prefix.hit_blocks},
            {"hit_tokens", kv_->prefix.hit_tokens},
            {"published_blocks", kv_->prefix.published},
            {"not_borrowed_promised", kv_->prefix.kept_free},
            {"evictions", kv_->pages->evictions()}}},
          {"kv_pages_promised", kv_->promised_not_taken()},
          {"kv_reserve_refusals", kv_->reserve_refusals},
          {"kv_page_tokens", options_.page_tokens},
          {"kv_type", std::string(dtype_name(options_.kv_type))},
          {"kv_page_bytes", kv_->page_bytes},
          {"kv_pool_bytes", uint64_t{kv_->n_pages} * kv_->page_bytes},
          {"max_context", options_.max_ctx},
          {"open_sequences", kv_->seqs.size()},
          {"parked_sequences", kv_->held.size()},
          {"steps", steps_},
          {"flag_wait_ms", flag_wait_us_ / 1000.0},
          {"phase_ms",
           {{"prepare", phases_.prepare_us / 1000.0},
            {"start", phases_.start_us / 1000.0},
            {"flags", phases_.flags_us / 1000.0},
            {"reports", phases_.reports_us / 1000.0},
            {"logits", phases_.logits_us / 1000.0},
            {"device", phases_.device_us / 1000.0}}},
          {"kv_bytes_copied", 0},
          {"recoveries", recoveries_},
          {"restarts", recoveries_},  // what the frontend reports as restarts seen
          {"preemptions", pstats_.preemptions},
          {"preempt_latency_max_us", pstats_.max_latency_us},
          {"parked", parked_.has_value()},
          {"last_failure", last_failure_}};
}

}  // namespace duet::frontend
