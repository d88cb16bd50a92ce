#include "services/npu_svc/graph_cache.h"

#include <algorithm>

#include "core/base/error.h"
#include "core/planner/npu_timing.h"

namespace duet::npu {

GraphCache::GraphCache(SocProfile soc) : soc_(std::move(soc)) {}

GraphCache::Key GraphCache::key_of(const OpShape& s) {
  return {static_cast<int>(s.kind),      static_cast<uint32_t>(s.wtype), s.m, s.k, s.n,
          s.weight_stationary_transposed};
}

GraphCache::Compiled GraphCache::compile(const OpShape& shape) {
  if (!dtype_known(static_cast<uint32_t>(shape.wtype)))
    throw Error(Errc::invalid_argument,
                "graph compile: unknown weight type in " + op_shape_name(shape));
  if (shape.k % dtype_block_elems(shape.wtype) != 0)
    throw Error(
        Errc::invalid_argument,
        "graph compile: k is not a multiple of the weight block in " + op_shape_name(shape));
  const double cost = npu_graph_compile_us(soc_, shape);  // validates the op and dims
  std::lock_guard lock(mutex_);
  auto [it, inserted] = graphs_.try_emplace(key_of(shape), shape, cost);
  if (!inserted) return {it->second.second, true};
  total_compile_us_ += cost;
  return {cost, false};
}

bool GraphCache::contains(const OpShape& shape) const {
  std::lock_guard lock(mutex_);
  return graphs_.count(key_of(shape)) > 0;
}

double GraphCache::prepare(const OpShape& shape, bool allow_online) {
  if (contains(shape)) return 0;
  if (!allow_online)
    throw Error(Errc::not_found, "no NPU graph for " + op_shape_name(shape) +
                                     " (compile it first, or allow online preparation)");
  const Compiled c = compile(shape);
  return c.cached ? 0 : c.compile_us;
}

std::vector<int64_t> GraphCache::cached_sizes(const OpShape& shape) const {
  std::vector<int64_t> sizes;
  OpShape probe = shape;
  std::lock_guard lock(mutex_);
  for (const auto& [key, entry] : graphs_) {
    probe.n = entry.first.n;
    if (entry.first == probe) sizes.push_back(probe.n);
  }
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

GraphCache::Resolved GraphCache::resolve(const OpShape& shape, NpuGraphMode mode) {
  Resolved r;
  auto with_n = [&](int64_t n) {
    OpShape g = shape;
    g.n = n;
    return g;
  };
  auto none = [&](const char* why) {
    return Error(Errc::not_found, "no NPU graph for " + op_shape_name(shape) + " (" + why +
                                      "; compile one first, or allow online preparation)");
  };
  switch (mode) {
    case NpuGraphMode::exact:
      if (!contains(shape)) throw none("mode exact");
      r.graphs.push_back(shape);
      return r;
    case NpuGraphMode::online_prepare:
      r.compile_us = prepare(shape, true);
      r.graphs.push_back(shape);
      return r;
    case NpuGraphMode::padding: {
      const std::vector<int64_t> sizes = cached_sizes(shape);
      auto it = std::lower_bound(sizes.begin(), sizes.end(), shape.n);
      if (it == sizes.end()) throw none("mode padding: no graph with at least as many tokens");
      r.graphs.push_back(with_n(*it));
      return r;
    }
    case NpuGraphMode::pipe: {
      const std::vector<int64_t> sizes = cached_sizes(shape);
      if (sizes.empty()) throw none("mode pipe: no graph of this op at any token count");
      for (int64_t left = shape.n; left > 0;) {
        auto fits = std::upper_bound(sizes.begin(), sizes.end(), left);
        const int64_t n = fits == sizes.begin() ? sizes.front() : *std::prev(fits);
        r.graphs.push_back(with_n(n));
        left -= n;
      }
      return r;
    }
  }
  throw Error(Errc::invalid_argument,
              "unknown NPU graph mode " + std::to_string(static_cast<int>(mode)));
}

size_t GraphCache::size() const {
  std::lock_guard lock(mutex_);
  return graphs_.size();
}

double GraphCache::total_compile_us() const {
  std::lock_guard lock(mutex_);
  return total_compile_us_;
}

std::vector<OpShape> GraphCache::shapes() const {
  std::lock_guard lock(mutex_);
  std::vector<OpShape> out;
  out.reserve(graphs_.size());
  for (const auto& [key, entry] : graphs_) out.push_back(entry.first);
  return out;
}

}  // namespace duet::npu
