#include "core/model/kv_budget.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include "core/base/error.h"
#include "core/base/settings.h"
#include "core/model/model.h"

namespace duet {

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string KvPoolPlan::summary() const {
  return std::to_string(n_pages) + " pages of " + std::to_string(page_tokens) + " tokens (" +
         format_bytes(pool_bytes) + ", " + std::to_string(bytes_per_token) +
         " B per token; a sequence of " + std::to_string(ctx) + " positions holds " +
         std::to_string(pages_per_seq) + " pages)";
}

KvPoolRequest kv_pool_request(const LlamaHparams& hp, int max_ctx, int max_seqs, int sharers,
                              uint64_t budget_bytes) {
  KvPoolRequest r;
  r.n_layer = hp.n_layer;
  r.kv_dim = hp.n_head_kv * hp.head_dim;
  r.model_ctx = hp.n_ctx;
  r.max_ctx = max_ctx;
  r.max_seqs = max_seqs;
  r.sharers = sharers;
  r.budget_bytes = budget_bytes;
  return r;
}

KvPoolPlan plan_kv_pool(const KvPoolRequest& q) {
  if (q.n_layer <= 0 || q.kv_dim <= 0 || q.model_ctx <= 0 || q.page_tokens == 0 ||
      q.bytes_per_value == 0 || q.values_per_block == 0 ||
      q.kv_dim % static_cast<int>(q.values_per_block) != 0 || q.max_seqs <= 0 || q.sharers <= 0)
    throw Error(Errc::invalid_argument, "KV pool: the model's geometry is empty");
  if (q.max_ctx < 0)
    throw Error(Errc::invalid_argument,
                "KV pool: a context of " + std::to_string(q.max_ctx) + " positions");
  KvPoolPlan p;
  p.budget_bytes = q.budget_bytes;
  p.page_tokens = q.page_tokens;
  p.ctx = static_cast<uint32_t>(q.max_ctx > 0 ? std::min(q.max_ctx, q.model_ctx) : q.model_ctx);
  p.pages_per_seq = (p.ctx + q.page_tokens - 1) / q.page_tokens;
  p.bytes_per_token = uint64_t{2} * static_cast<uint64_t>(q.n_layer) *
                      static_cast<uint64_t>(q.kv_dim) / q.values_per_block * q.bytes_per_value;
  p.page_bytes = p.bytes_per_token * q.page_tokens;
  const uint64_t layer_page_bytes = p.page_bytes / static_cast<uint64_t>(q.n_layer);
  const uint64_t seq_bytes = uint64_t{p.pages_per_seq} * p.page_bytes;
  const uint64_t layer_cap_pages = kMaxKvLayerBytes / layer_page_bytes;
  if (layer_cap_pages < p.pages_per_seq)
    throw Error(Errc::invalid_argument,
                "KV pool: a sequence of " + std::to_string(p.ctx) + " positions needs " +
                    format_bytes(uint64_t{p.pages_per_seq} * layer_page_bytes) +
                    " per layer, past the " + format_bytes(kMaxKvLayerBytes) +
                    " a layer's region may take (a device's largest buffer): ask for a smaller "
                    "context (DUET_MAX_CTX)");
  const uint64_t budget_pages = q.budget_bytes / p.page_bytes;
  if (budget_pages < p.pages_per_seq)
    throw Error(Errc::invalid_argument,
                "KV pool: a budget of " + format_bytes(q.budget_bytes) +
                    " holds less than one sequence of the " + std::to_string(p.ctx) +
                    "-position context (" + format_bytes(seq_bytes) + " at " +
                    std::to_string(p.bytes_per_token) +
                    " B per token): give a larger --kv-memory, or a smaller context "
                    "(DUET_MAX_CTX)");
  const uint64_t all_seqs_pages = uint64_t{p.pages_per_seq} * static_cast<uint64_t>(q.max_seqs) *
                                  static_cast<uint64_t>(q.sharers);
  const uint64_t pages = std::min({budget_pages, all_seqs_pages, layer_cap_pages,
                                   uint64_t{std::numeric_limits<int32_t>::max()}});
  p.n_pages = static_cast<uint32_t>(pages);
  p.pool_bytes = uint64_t{p.n_pages} * p.page_bytes;
  return p;
}

std::vector<KvPoolPlan> plan_kv_pools(std::vector<KvPoolRequest> requests, uint64_t budget_bytes) {
  if (requests.size() == 1) {
    requests[0].budget_bytes = budget_bytes;
    return {plan_kv_pool(requests[0])};
  }
  // Water-filling: shares in proportion to one sequence's bytes; a model whose cap is below its
  // share takes its cap and the rest is shared again among the others.
  const size_t n = requests.size();
  std::vector<uint64_t> seq(n), cap(n), share(n, 0);
  for (size_t i = 0; i < n; ++i) {
    KvPoolRequest unbounded = requests[i];
    unbounded.budget_bytes = std::numeric_limits<uint64_t>::max() / 2;
    const KvPoolPlan p = plan_kv_pool(unbounded);
    seq[i] = uint64_t{p.pages_per_seq} * p.page_bytes;
    cap[i] = p.pool_bytes;
  }
  std::vector<bool> fixed(n, false);
  uint64_t left = budget_bytes;
  for (bool changed = true; changed;) {
    changed = false;
    long double weight = 0;
    for (size_t i = 0; i < n; ++i)
      if (!fixed[i]) weight += static_cast<long double>(seq[i]);
    if (weight == 0) break;
    for (size_t i = 0; i < n; ++i) {
      if (fixed[i]) continue;
      share[i] = static_cast<uint64_t>(static_cast<long double>(left) *
                                       static_cast<long double>(seq[i]) / weight);
      if (share[i] >= cap[i]) {
        share[i] = cap[i];
        fixed[i] = true;
        left -= cap[i];
        changed = true;
        break;  // the others' shares grow: compute them again
      }
    }
  }
  std::vector<KvPoolPlan> plans;
  for (size_t i = 0; i < n; ++i) {
    requests[i].budget_bytes = share[i];
    try {
      plans.push_back(plan_kv_pool(requests[i]));
    } catch (const Error& e) {
      throw Error(e.code(), "model " + std::to_string(i) + ": " + e.what() + " (its share of " +
                                format_bytes(budget_bytes) + " for " + std::to_string(n) +
                                " models)");
    }
  }
  return plans;
}

uint64_t parse_memory_size(std::string_view text) {
  return parse_setting_size(text);  // one parser for --kv-memory and the kv.memory setting
}

DType parse_kv_type(std::string_view text) {
  if (text == "f16" || text == "F16") return DType::F16;
  if (text == "f32" || text == "F32") return DType::F32;
  if (text == "q8_0" || text == "Q8_0") return DType::Q8_0;
  throw Error(Errc::invalid_argument,
              "KV type '" + std::string(text) + "' is not one of f16 (the default), f32 or q8_0");
}

uint64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  throw Error(Errc::io, "cannot read MemAvailable from /proc/meminfo");
}

uint64_t shm_free_bytes() {
  struct statvfs st {};
  if (statvfs("/dev/shm", &st) != 0) throw Error(Errc::io, "cannot statvfs /dev/shm");
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

uint64_t default_kv_memory_bytes() {
  const auto share = static_cast<uint64_t>(static_cast<double>(available_memory_bytes()) *
                                           kDefaultKvMemoryFraction);
  return std::min(share, shm_free_bytes());
}

}  // namespace duet
