// Symbolic size expressions and the arena slot planner (core/program/symbolic.h).
#include "core/program/symbolic.h"

#include <algorithm>
#include <limits>

#include "core/base/error.h"

namespace duet {

std::array<uint64_t, kMonomials> monomial_values(const SymValues& v) {
  const uint64_t sym[kSymbols] = {v.tokens, v.seqs, v.pages};
  std::array<uint64_t, kMonomials> out{};
  for (unsigned m = 0; m < kMonomials; ++m) {
    uint64_t p = 1;
    for (int s = 0; s < kSymbols; ++s)
      if (m & (1u << s)) p *= sym[s];
    out[m] = p;
  }
  return out;
}

SymExpr SymExpr::constant(uint64_t c) {
  SymExpr e;
  e.c_[0] = c;
  return e;
}

SymExpr SymExpr::symbol(Sym s, uint64_t coef) {
  SymExpr e;
  e.c_[1u << static_cast<unsigned>(s)] = coef;
  return e;
}

SymExpr SymExpr::from_coefs(std::span<const uint64_t> coefs) {
  if (coefs.size() != kMonomials)
    throw Error(Errc::invalid_argument, "symbolic expression of " + std::to_string(coefs.size()) +
                                            " coefficients (" + std::to_string(kMonomials) + ")");
  SymExpr e;
  for (unsigned m = 0; m < kMonomials; ++m) e.c_[m] = coefs[m];
  return e;
}

SymExpr SymExpr::operator+(const SymExpr& o) const {
  SymExpr e;
  for (unsigned m = 0; m < kMonomials; ++m) e.c_[m] = c_[m] + o.c_[m];
  return e;
}

SymExpr SymExpr::operator*(uint64_t k) const {
  SymExpr e;
  for (unsigned m = 0; m < kMonomials; ++m) e.c_[m] = c_[m] * k;
  return e;
}

SymExpr SymExpr::operator*(const SymExpr& o) const {
  SymExpr e;
  for (unsigned a = 0; a < kMonomials; ++a)
    for (unsigned b = 0; b < kMonomials; ++b) {
      if (c_[a] == 0 || o.c_[b] == 0) continue;
      if (a & b)
        throw Error(Errc::invalid_argument,
                    "symbolic expression: " + str() + " times " + o.str() + " squares a symbol");
      e.c_[a | b] += c_[a] * o.c_[b];
    }
  return e;
}

bool SymExpr::is_constant() const {
  for (unsigned m = 1; m < kMonomials; ++m)
    if (c_[m] != 0) return false;
  return true;
}

uint64_t SymExpr::eval(const std::array<uint64_t, kMonomials>& monomials) const {
  uint64_t v = 0;
  for (unsigned m = 0; m < kMonomials; ++m) v += c_[m] * monomials[m];
  return v;
}

uint64_t SymExpr::eval(const SymValues& v) const {
  return eval(monomial_values(v));
}

SymExpr SymExpr::aligned(uint64_t a) const {
  SymExpr e;
  for (unsigned m = 0; m < kMonomials; ++m) e.c_[m] = (c_[m] + a - 1) / a * a;
  return e;
}

std::string SymExpr::str() const {
  static constexpr const char* kNames[kSymbols] = {"N", "S", "P"};
  std::string out;
  // Highest monomials first, the constant last: "256*N + 64".
  for (unsigned m = kMonomials; m-- > 0;) {
    if (c_[m] == 0) continue;
    if (!out.empty()) out += " + ";
    std::string term = m == 0 || c_[m] != 1 ? std::to_string(c_[m]) : "";
    for (int s = 0; s < kSymbols; ++s)
      if (m & (1u << s)) term += (term.empty() ? "" : "*") + std::string(kNames[s]);
    out += term;
  }
  return out.empty() ? "0" : out;
}

bool provably_le(const SymExpr& a, const SymExpr& b) {
  for (unsigned m = 0; m < kMonomials; ++m)
    if (a.coef(m) > b.coef(m)) return false;
  return true;
}

SlotPlan plan_slots(const std::vector<SymTensor>& tensors, const SymExpr& base,
                    const SymValues& largest, bool reuse) {
  constexpr uint64_t kAlign = 64;
  SlotPlan plan;
  plan.slot_of.resize(tensors.size());
  std::vector<uint32_t> busy_until;  // per slot: its current tenant's last access
  // Tensors by first access: a slot is free for a tensor once every earlier tenant is done.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensors[a].first < tensors[b].first; });
  for (size_t t : order) {
    const SymTensor& tensor = tensors[t];
    if (tensor.last < tensor.first)
      throw Error(Errc::internal, "slot planner: a tensor's last access precedes its first");
    const SymExpr need = tensor.bytes.aligned(kAlign);
    size_t best = std::numeric_limits<size_t>::max();
    if (reuse)
      for (size_t s = 0; s < plan.size.size(); ++s) {
        if (busy_until[s] >= tensor.first || !provably_le(need, plan.size[s])) continue;
        if (best == std::numeric_limits<size_t>::max() ||
            plan.size[s].eval(largest) < plan.size[best].eval(largest))
          best = s;
      }
    if (best == std::numeric_limits<size_t>::max()) {
      if (plan.size.size() >= std::numeric_limits<uint16_t>::max())
        throw Error(Errc::out_of_range, "slot planner: too many slots");
      best = plan.size.size();
      plan.size.push_back(need);
      busy_until.push_back(0);
    }
    plan.slot_of[t] = static_cast<uint16_t>(best);
    busy_until[best] = tensor.last;
  }
  SymExpr at = base.aligned(kAlign);
  for (const SymExpr& size : plan.size) {
    plan.offset.push_back(at);
    at = at + size;
  }
  plan.end = at;
  return plan;
}

}  // namespace duet
