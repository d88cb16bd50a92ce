#include "core/model/dtype.h"

#include <string>

#include "core/base/error.h"

namespace duet {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  int64_t block_elems;
  size_t
      block_bytes;  // equal to sizeof the block struct in core/model/quant.h (static_asserts there)
};

constexpr DTypeInfo kInfo[] = {
    {DType::F32, "F32", 1, 4},         {DType::F16, "F16", 1, 2},
    {DType::Q4_0, "Q4_0", kQK, 18},    {DType::Q4_1, "Q4_1", kQK, 20},
    {DType::Q5_0, "Q5_0", kQK, 22},    {DType::Q5_1, "Q5_1", kQK, 24},
    {DType::Q8_0, "Q8_0", kQK, 34},    {DType::Q4_K, "Q4_K", kQK_K, 144},
    {DType::Q5_K, "Q5_K", kQK_K, 176}, {DType::Q6_K, "Q6_K", kQK_K, 210},
    {DType::BF16, "BF16", 1, 2},       {DType::E0M4, "E0M4", 128, 68},
};

const DTypeInfo* find(DType t) {
  for (const DTypeInfo& i : kInfo)
    if (i.type == t) return &i;
  return nullptr;
}

const DTypeInfo& info(DType t) {
  if (const DTypeInfo* i = find(t)) return *i;
  throw Error(Errc::unsupported, "unknown dtype " + std::to_string(static_cast<uint32_t>(t)));
}

}  // namespace

bool dtype_known(uint32_t raw) {
  return find(static_cast<DType>(raw)) != nullptr;
}

std::string_view dtype_name(DType t) {
  const DTypeInfo* i = find(t);
  return i ? i->name : "unknown";
}

int64_t dtype_block_elems(DType t) {
  return info(t).block_elems;
}

size_t dtype_block_bytes(DType t) {
  return info(t).block_bytes;
}

bool dtype_is_k_quant(DType t) {
  return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}

size_t dtype_row_bytes(DType t, int64_t n) {
  const int64_t block = dtype_block_elems(t);
  if (n < 0 || n % block != 0) {
    throw Error(Errc::invalid_argument,
                "row of " + std::to_string(n) + " elements is not a multiple of " +
                    std::string(dtype_name(t)) + "'s block size " + std::to_string(block));
  }
  return static_cast<size_t>(n / block) * dtype_block_bytes(t);
}

}  // namespace duet
