#pragma once
// Static NPU graphs. A real NPU runs only graphs compiled ahead for one static shape (op, M, N,
// K, dtypes, operand order); compiling one ("online preparation") costs hundreds of ms. The
// cache records which shapes have a graph and charges the modelled compile time
// (npu_graph_compile_us) once per shape. Running a shape with no graph is an error, unless the
// caller asks for online preparation, which compiles it then and pays the cost in modelled time.
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/planner/op_shape.h"
#include "core/planner/soc_profile.h"
#include "core/program/plan.h"

namespace duet::npu {

class GraphCache {
 public:
  explicit GraphCache(SocProfile soc);

  struct Compiled {
    double compile_us = 0;  // modelled preparation time of the graph
    bool cached = false;    // true: it was compiled before and nothing was paid now
  };
  // Compiles the graph of `shape` if it has none. Throws invalid_argument/unsupported for a shape
  // the NPU cannot run.
  Compiled compile(const OpShape& shape);

  bool contains(const OpShape& shape) const;
  // The modelled preparation cost to run `shape` now: 0 when its graph is cached; its compile
  // cost when allow_online (the graph is then cached); otherwise throws Errc::not_found naming
  // the shape.
  double prepare(const OpShape& shape, bool allow_online);

  // The graphs that run `shape` under a graph mode (core/program/plan.h NpuGraphMode), in order:
  //   exact           its own graph (not_found if none);
  //   padding         the smallest cached graph of the same op with n' >= n (padded);
  //   online_prepare  its own graph, compiled now if missing (compile_us > 0 then);
  //   pipe            cached graphs of the same op in a row covering n: the largest that fits
  //                   the remaining tokens, the last one padded if none fits.
  struct Resolved {
    std::vector<OpShape> graphs;
    double compile_us = 0;
  };
  Resolved resolve(const OpShape& shape, NpuGraphMode mode);

  size_t size() const;
  double total_compile_us() const;  // modelled time spent compiling, all graphs
  std::vector<OpShape> shapes() const;
  const SocProfile& soc() const { return soc_; }

 private:
  using Key = std::tuple<int, uint32_t, int64_t, int64_t, int64_t, bool>;
  static Key key_of(const OpShape& s);
  // Token counts of the cached graphs that differ from `shape` only in n, ascending.
  std::vector<int64_t> cached_sizes(const OpShape& shape) const;

  SocProfile soc_;
  mutable std::mutex mutex_;
  std::map<Key, std::pair<OpShape, double>> graphs_;  // shape -> (shape, compile us)
  double total_compile_us_ = 0;
};

}  // namespace duet::npu
