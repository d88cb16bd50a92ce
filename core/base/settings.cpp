#include "core/base/settings.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/base/error.h"

namespace duet {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// subgraph:* is a Puzzle placement file (puzzle/subgraph_plan.h): `subgraph:PATH`.
#define DUET_PLANS                                                                       \
  "auto|tensor|gpu-only|npu-only|npu-only:online-prepare|npu-only:pipe|layer|reference|" \
  "subgraph:*"
constexpr const char* kPlans = DUET_PLANS;
constexpr const char* kPlansOrEmpty = "|" DUET_PLANS;  // empty: follow another setting
#undef DUET_PLANS

using T = SettingType;

// Every DUET_* variable a duet process reads. Keyed ones can be set in a stack's config file;
// the rest are where a process runs or test hooks, read from the environment only. A default
// left empty means "none": the reader decides (the model's context, the memory free now...).
// Defaults and ranges are the ones the readers had before the table (their measured choices
// are explained where they are used).
const std::array kSettings = {
    // The stack: its plan and what it is solved for.
    Setting{"DUET_PLAN", "plan", T::choice, "auto", 0, 0, kPlans,
            "the frontend's plan: auto executes the solver's plan for this host and models the "
            "SoC's; the others pin one placement (`stack up --plan`)"},
    Setting{"DUET_TIMING", "timing", T::choice, "", 0, 0, "|modeled|measured",
            "what the solver optimises the executed plan for; empty: the plan's own (auto: "
            "measured, tensor: modeled) (`stack up --timing`)"},
    Setting{"DUET_WARMUP", "warmup", T::choice, "on", 0, 0, "on|off",
            "`stack up` warms each model's engines up once the stack is healthy (one step per "
            "token bucket on a scratch sequence, outside the metrics), so the first request does "
            "not pay for building them; off: the first request builds them (`stack up "
            "--no-warmup`)"},
    // The KV pool.
    Setting{"DUET_KV_MEMORY", "kv.memory", T::size, "", 0, 0, "",
            "memory for the KV page pool, e.g. 2G; empty: a quarter of the memory available, "
            "capped by /dev/shm's free space (`stack up --kv-memory`)"},
    Setting{"DUET_KV_TYPE", "kv.type", T::choice, "f16", 0, 0, "f16|f32|q8_0",
            "KV cache values (`stack up --kv-type`)"},
    Setting{"DUET_MAX_CTX", "kv.max_ctx", T::integer, "0", 0, 1 << 24, "",
            "the longest context a sequence may have; 0: the model's"},
    Setting{"DUET_KV_PREFIX", "kv.prefix_sharing", T::choice, "on", 0, 0, "on|off",
            "share the KV pages of a common prompt prefix between requests"},
    // The frontend.
    Setting{"DUET_MAX_QUEUE", "frontend.max_queue", T::integer, "64", 0, 1 << 20, "",
            "requests waiting beyond the running batch; one more is refused (busy)"},
    Setting{"DUET_TRACE_STEPS", "frontend.trace_steps", T::integer, "1024", 0, 1 << 20, "",
            "recent steps the frontend keeps for `duet trace`"},
    Setting{"DUET_PROGRAMS", "frontend.programs", T::choice, "symbolic", 0, 0,
            "symbolic|per-bucket",
            "symbolic: one program per model and plan, its arena offsets evaluated per step "
            "(Transformer-Lite's symbolic shapes); per-bucket: one per token bucket, as before "
            "(for comparisons)"},
    // Agent.xpu (issue 9): the proactive lane.
    Setting{"DUET_AGENT", "agent.enabled", T::choice, "on", 0, 0, "on|off",
            "a second engine for proactive requests, preempted by reactive ones; off: one "
            "engine serves all"},
    Setting{"DUET_AGENT_DECODE_CAP", "agent.decode_cap", T::integer, "3", 0, 1024, "",
            "Algorithm 2's cap: proactive decoders riding in a reactive step"},
    Setting{"DUET_AGENT_AGING_MS", "agent.aging_ms", T::number, "30000", 1, 1e9, "",
            "a proactive request waiting this long is served as a reactive one"},
    // The default chosen by measurement (bench/agent/RESULTS.md, 2026-11-22 16:10 UTC section).
    Setting{"DUET_AGENT_RIDER_SLACK", "agent.rider_slack", T::number, "0", 0, kInf, "",
            "a proactive decoder rides only while the step's predicted time stays within "
            "(1 + slack) of the step without it; inf: the cap alone"},
    Setting{"DUET_AGENT_PROACTIVE_CARRY", "agent.proactive_carry", T::choice, "off", 0, 0, "on|off",
            "proactive decoders ride in the proactive prefill step"},
    Setting{"DUET_AGENT_PREEMPT", "agent.preempt", T::choice, "on", 0, 0, "on|off",
            "proactive steps are preemptible by reactive arrivals"},
    Setting{"DUET_AGENT_OVERLAP", "agent.overlap", T::choice, "off", 0, 0, "off|proactive|all",
            "the proactive prefill step beside the main engine's steps"},
    Setting{"DUET_AGENT_PROACTIVE_PLAN", "agent.proactive_plan", T::choice, "", 0, 0, kPlansOrEmpty,
            "the proactive engine's plan; empty: gpu-only when the stack's plan splits prefill "
            "(auto, tensor), else the stack's plan"},
    // The default chosen by measurement (bench/agent/RESULTS.md, 2026-11-23).
    Setting{"DUET_AGENT_PROACTIVE_STEP_TOKENS", "agent.proactive_step_tokens", T::integer, "256",
            64, 512, "", "prompt tokens in one proactive prefill step"},
    // gpu_svc.
    Setting{"DUET_OPENCL_DEVICE", "gpu.device", T::text, "", 0, 0, "",
            "the OpenCL device gpu_svc opens, PLATFORM:DEVICE (indices); empty: the first GPU, "
            "else the first device"},
    Setting{"DUET_GPU_NARROW", "gpu.narrow", T::choice, "auto", 0, 0, "auto|off|on",
            "small steps on PoCL's single-threaded queue: auto measures which is faster"},
    Setting{"DUET_GPU_NARROW_MAX_TOKENS", "gpu.narrow_max_tokens", T::integer, "16", 1, 4096, "",
            "the largest step (tokens) the narrow queue may take"},
    Setting{"DUET_GPU_INT8_MATMUL", "gpu.int8_matmul", T::choice, "1", 0, 0, "0|1",
            "Q8_0/Q4_0 matmuls on int8 activations where the kernels exist; 0: off"},
    Setting{"DUET_GPU_INT8_VNNI", "gpu.int8_vnni", T::choice, "1", 0, 0, "0|1",
            "the int8 matmuls' AVX512-VNNI kernels on hosts that have it; 0: off"},
    Setting{"DUET_GPU_INT8_AMX", "gpu.int8_amx", T::choice, "1", 0, 0, "0|1",
            "the int8 GEMMs' AMX tile kernels (launches of more than 8 tokens) on hosts with "
            "AMX-INT8 whose kernel grants the tile state; the same bits as VNNI; 0: off"},
    Setting{"DUET_GPU_FUSE", "gpu.fuse", T::choice, "1", 0, 0, "0|1",
            "fused launches of a decode step's small ops: on the CPU integer path add + rmsnorm + "
            "quantise, swiglu + quantise, the q/k ropes, the q/k/v and gate/up matmuls; on GPUs "
            "add + rmsnorm, the q/k ropes, the q/k/v and gate/up GEMVs; the same bits either way; "
            "0: off"},
    Setting{"DUET_GPU_OP_TIMING", "gpu.op_timing", T::choice, "auto", 0, 0, "auto|on|off",
            "per-op device times from OpenCL profiling events (duet trace's op spans, the "
            "steps' device time); auto: on for zero-copy devices (CPU, integrated GPUs), off for "
            "discrete GPUs, where a profiled launch costs ~6 us more host time (NVIDIA: 18 vs 12 "
            "us); off: a step's device time is its wall time"},
    Setting{"DUET_GPU_ATTENTION", "gpu.attention", T::choice, "shared", 0, 0,
            "shared|per_head|portable|work_group",
            "attention kernels: shared (CPU devices: a KV head's query heads read its K/V once; "
            "GPUs: work_group), per_head (CPU devices), work_group (a work-group per head, token "
            "and chunk), or portable (a work-item per head, token and chunk)"},
    Setting{"DUET_GPU_LOW_PRIORITY", "gpu.low_priority", T::choice, "on", 0, 0, "on|off",
            "proactive (preemptible) steps on a CL_QUEUE_PRIORITY_LOW_KHR queue where the device "
            "has cl_khr_priority_hints; off: one queue"},
    Setting{"DUET_GPU_INT8_ACT_BITS", "gpu.int8_act_bits", T::text, "", 0, 0, "",
            "activation bits of the int8 matmuls, one number or role=bits pairs "
            "(GpuKernels::set_int8_act_bits); empty: 16 for every role (8 flips clear-margin "
            "tokens in some plan; on K-quant files 8 is +45-55% prefill at half llama.cpp's "
            "activation noise: bench/kquant/RESULTS.md)"},
    Setting{"DUET_GPU_KV_MAX_BUFFER", "gpu.kv_max_buffer", T::integer, "", 1, 1e18, "",
            "bytes of the largest OpenCL buffer the KV pool is mapped as; empty: the device's "
            "limit"},
    Setting{"DUET_GPU_MEMORY", "gpu.memory", T::size, "", 0, 0, "",
            "device memory gpu_svc may fill on a discrete GPU (weights, arena, KV pool), e.g. "
            "20G; empty: the device's global memory"},
    Setting{"DUET_GPU_FORCE_COPIES", "gpu.force_copies", T::choice, "0", 0, 0, "0|1",
            "copy buffers even where the device could map host memory (tests the copy path)"},
    // Where things are.
    Setting{"DUET_MODELS", "models", T::text, "", 0, 0, "",
            "the models one stack serves, comma-separated PATH or NAME=PATH (name: the file's "
            "stem); the first is the default; empty: --model's one (`stack up --model` repeated)"},
    Setting{"DUET_MODEL_PLANS", "model_plans", T::text, "", 0, 0, "",
            "plans of single models in a several-model stack, comma-separated NAME=PLAN (e.g. "
            "qwen=subgraph:/p/q.json); the others run DUET_PLAN (`stack up --model-plan`)"},
    Setting{"DUET_MODEL_PRIORITIES", "model_priorities", T::text, "", 0, 0, "",
            "priorities of models in a several-model stack, comma-separated NAME=RANK (0 runs "
            "first, as Puzzle's ranks; unlisted: 0); where models' steps contend the lowest "
            "rank steps first, aged by model_priority_aging (`stack up --model-priority`)"},
    Setting{"DUET_MODEL_PRIORITY_AGING", "model_priority_aging", T::integer, "8", 1, 1 << 20, "",
            "steps a ready model waits behind others per rank it is behind: it then steps as "
            "if one rank higher, so its wait is at most (its rank - the best rank) x this + "
            "models - 1 steps"},
    Setting{"DUET_MODEL_DIRS", "model_dirs", T::text, "", 0, 0, "",
            "more directories (colon-separated) whose models peers may name, beside the "
            "stack's --model's"},
    Setting{"DUET_SOC_DIR", "soc_dir", T::text, "", 0, 0, "",
            "a directory searched first for SoC profiles (<name>.toml)"},
    Setting{"DUET_CACHE_DIR", "cache_dir", T::text, "", 0, 0, "",
            "kernel binaries, profiles and plans; empty: $XDG_CACHE_HOME/duet or ~/.cache/duet"},
    Setting{"DUET_LOG_MAX_BYTES", "log.max_bytes", T::integer, "16777216", 4096, 1099511627776.0,
            "", "bytes of a process's log before it rotates"},
    Setting{"DUET_LOG_FILES", "log.files", T::integer, "3", 1, 100, "",
            "rotated log files kept per process besides the current one"},
    // Environment only: they say where a stack is, not how it runs.
    Setting{"DUET_STACK", "", T::text, "", 0, 0, "", "the stack id the CLI uses by default"},
    Setting{"DUET_RUN_ROOT", "", T::text, "", 0, 0, "",
            "where run dirs are; empty: $XDG_RUNTIME_DIR/duet, else /tmp/duet-<uid>"},
    Setting{"DUET_SUPERVISOR_PID", "", T::integer, "", 1, 1 << 30, "",
            "set by the supervisor for its services: they exit when it dies"},
    Setting{"DUET_CRASH_AT_START", "", T::text, "", 0, 0, "",
            "test hook: the named services (comma-separated) abort at start"},
};

[[noreturn]] void refuse(const Setting& s, std::string_view value, const std::string& why) {
  // Both names: the file's key for a config file's author, the variable for the environment's.
  const std::string var = std::string(s.env) + "='" + std::string(value) + "'";
  throw Error(Errc::invalid_argument,
              (s.key.empty() ? var : std::string(s.key) + " (" + var + ")") + ": " + why);
}

bool parse_double(std::string_view text, double& out) {
  const std::string s(text);
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end != s.c_str() && *end == '\0' && !std::isnan(out);
}

std::string format_bound(double v) {
  if (std::isinf(v)) return "inf";
  if (v == std::floor(v) && std::fabs(v) < 1e18) return std::to_string(static_cast<int64_t>(v));
  return std::to_string(v);
}

const Setting& require(std::string_view env) {
  const Setting* s = find_setting_env(env);
  if (!s)
    throw Error(Errc::internal, "'" + std::string(env) +
                                    "' is not in the settings registry (core/base/settings.cpp)");
  return *s;
}

}  // namespace

std::string Setting::type_name() const {
  switch (type) {
    case SettingType::text:
      return "text";
    case SettingType::integer:
      return "integer [" + format_bound(min) + ", " + format_bound(max) + "]";
    case SettingType::number:
      return "number [" + format_bound(min) + ", " + format_bound(max) + "]";
    case SettingType::choice:  // a leading "|": empty is one of the choices
      return (choices.starts_with('|') ? "(empty)" : "") + std::string(choices);
    case SettingType::size:
      return "size (4G, 512M, bytes)";
  }
  return "?";
}

std::span<const Setting> all_settings() {
  return kSettings;
}

const Setting* find_setting_env(std::string_view env) {
  for (const Setting& s : kSettings)
    if (s.env == env) return &s;
  return nullptr;
}

const Setting* find_setting_key(std::string_view key) {
  for (const Setting& s : kSettings)
    if (!s.key.empty() && s.key == key) return &s;
  return nullptr;
}

void check_setting(const Setting& s, std::string_view value) {
  switch (s.type) {
    case SettingType::text:
      return;
    case SettingType::choice: {
      std::string_view rest = s.choices;
      for (;;) {
        const size_t bar = rest.find('|');
        const std::string_view choice = rest.substr(0, bar);
        if (choice == value) return;
        // "prefix:*": the prefix and something after it (a path).
        if (choice.ends_with('*') && value.size() >= choice.size() &&
            value.starts_with(choice.substr(0, choice.size() - 1)))
          return;
        if (bar == std::string_view::npos) break;
        rest.remove_prefix(bar + 1);
      }
      std::string list(s.choices);
      std::replace(list.begin(), list.end(), '|', ' ');
      refuse(s, value, "not one of: " + list + (s.choices.front() == '|' ? " (or empty)" : ""));
    }
    case SettingType::integer:
    case SettingType::number: {
      double x = 0;
      if (!parse_double(value, x) || x < s.min || x > s.max)
        refuse(s, value,
               "not a number in [" + format_bound(s.min) + ", " + format_bound(s.max) + "]");
      if (s.type == SettingType::integer && x != std::floor(x))
        refuse(s, value, "not a whole number");
      return;
    }
    case SettingType::size:
      try {
        (void)parse_setting_size(value);
      } catch (const Error& e) {
        refuse(s, value, e.what());
      }
      return;
  }
}

std::optional<std::string> setting_override(std::string_view env) {
  const Setting& s = require(env);
  const char* v = std::getenv(std::string(env).c_str());
  if (!v || !*v) return std::nullopt;
  check_setting(s, v);
  return std::string(v);
}

std::string setting_text(std::string_view env) {
  const Setting& s = require(env);
  return setting_override(env).value_or(std::string(s.def));
}

double setting_number(std::string_view env) {
  const std::string v = setting_text(env);
  double x = 0;
  if (!parse_double(v, x))
    throw Error(Errc::internal, std::string(env) + " has no value and no numeric default");
  return x;
}

int64_t setting_int(std::string_view env) {
  return static_cast<int64_t>(setting_number(env));
}

bool setting_on(std::string_view env) {
  return setting_text(env) == "on";
}

uint64_t parse_setting_size(std::string_view text) {
  const auto bad = [&] {
    return Error(Errc::invalid_argument,
                 "memory size '" + std::string(text) +
                     "' is not a size (a number with an optional K, M, G or T suffix, e.g. 4G)");
  };
  std::string s(text);
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(s, &end);
  } catch (const std::exception&) {
    throw bad();
  }
  std::string unit = s.substr(end);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  double scale = 1;
  if (!unit.empty() && unit != "B") {
    const std::string units = "KMGT";
    const size_t at = units.find(unit[0]);
    const std::string rest = unit.substr(1);
    if (at == std::string::npos || !(rest.empty() || rest == "B" || rest == "I" || rest == "IB"))
      throw bad();
    scale = std::pow(1024.0, static_cast<double>(at + 1));
  }
  const double bytes = value * scale;
  if (!std::isfinite(bytes) || bytes < 1 || bytes > 1e18) throw bad();
  return static_cast<uint64_t>(bytes);
}

}  // namespace duet
