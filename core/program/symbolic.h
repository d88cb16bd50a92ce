#pragma once
// Symbolic shapes (Transformer-Lite §2.1): one program per model and plan, whose arena tensor
// sizes and offsets are expressions of a step's symbols, evaluated once per step.
//
// The symbols are what a step's activations scale with:
//   N  tokens in the step           every activation row (x, q, k, ..., the FFN's gate and up)
//   S  entries (sequences) in it    page-table rows, logits rows (one per entry at most)
//   P  page-table columns           pages of the longest sequence the step addresses
// Context positions enter as P = ceil(positions / page_tokens), so every size is a polynomial
// with no division. Expressions are sums of non-negative coefficients times products of distinct
// symbols (8 monomials: 1, N, S, N*S, P, N*P, S*P, N*S*P): sizes only grow with each symbol, so an
// expression's largest value is at the symbols' largest values, and a step's values make any
// expression 8 multiply-adds over monomial values computed once per step.
//
// Slot reuse (the paper's memory reuse): a slot may take a tensor whose size is provably at most
// the slot's for every symbol value. `provably_le` proves it coefficient by coefficient (the same
// expression, or the same monomials with smaller coefficients): N*4096 fits N*32*128 (equal), but
// N*4096 and S*P*256 are incomparable, so they never share a slot.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace duet {

enum class Sym : uint8_t { tokens = 0, seqs = 1, pages = 2 };  // N, S, P
inline constexpr int kSymbols = 3;
inline constexpr int kMonomials = 1 << kSymbols;  // a monomial is a bit mask of its symbols

struct SymValues {
  uint64_t tokens = 0;  // N
  uint64_t seqs = 0;    // S
  uint64_t pages = 0;   // P
};

// The 8 monomials' values for one step's symbols (computed once per step).
std::array<uint64_t, kMonomials> monomial_values(const SymValues& v);

class SymExpr {
 public:
  SymExpr() = default;
  static SymExpr constant(uint64_t c);
  static SymExpr symbol(Sym s, uint64_t coef = 1);
  // An expression from its kMonomials coefficients (a program's flat table): invalid_argument
  // for a span of another length.
  static SymExpr from_coefs(std::span<const uint64_t> coefs);

  SymExpr operator+(const SymExpr& o) const;
  SymExpr operator*(uint64_t k) const;
  // A product of expressions: invalid_argument when a symbol would be squared (not a monomial).
  SymExpr operator*(const SymExpr& o) const;
  bool operator==(const SymExpr&) const = default;

  uint64_t coef(unsigned monomial) const { return c_[monomial]; }
  const std::array<uint64_t, kMonomials>& coefs() const { return c_; }
  bool is_constant() const;
  uint64_t eval(const SymValues& v) const;
  uint64_t eval(const std::array<uint64_t, kMonomials>& monomials) const;
  // Every coefficient rounded up to a multiple of `a`: at least this expression for every value,
  // and a multiple of `a` for every value (arena slots stay 64-byte aligned at every N).
  SymExpr aligned(uint64_t a) const;
  // The symbols replaced by values: the constant expression of this step's value.
  SymExpr at(const SymValues& v) const { return constant(eval(v)); }
  std::string str() const;  // "256*N + 64", "0"

 private:
  std::array<uint64_t, kMonomials> c_{};
};

// a <= b for every value of the symbols (each >= 0), proved coefficient by coefficient. False
// means "not provable by this rule", not "a > b".
bool provably_le(const SymExpr& a, const SymExpr& b);

// A tensor of the step for the slot planner: its size and the ops (model order, both devices'
// ops interleaved as the builder emits them) from its first write to its last access.
struct SymTensor {
  SymExpr bytes;
  uint32_t first = 0;
  uint32_t last = 0;
};

// Where the tensors go: slots laid out one after another from `base`, each a 64-aligned size
// expression; offset[k + 1] = offset[k] + size[k], so slots never overlap at any symbol value.
// With reuse, a tensor takes a free slot (its last tenant's last access is before the tensor's
// first) whose size provably holds it, the smallest such at the symbols' largest values; else a
// new slot of its own size. Without reuse every tensor has a slot of its own.
struct SlotPlan {
  std::vector<uint16_t> slot_of;  // per tensor
  std::vector<SymExpr> size;      // per slot
  std::vector<SymExpr> offset;    // per slot
  SymExpr end;                    // offset + size of the last slot: the arena the slots need
};
SlotPlan plan_slots(const std::vector<SymTensor>& tensors, const SymExpr& base,
                    const SymValues& largest, bool reuse);

}  // namespace duet
