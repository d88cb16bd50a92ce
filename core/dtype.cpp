#include "core/dtype.h"

#include <string>

#include "core/error.h"

namespace duet {

bool dtype_known(uint32_t raw) {
  switch (static_cast<DType>(raw)) {
    case DType::F32:
    case DType::F16:
    case DType::Q4_0:
    case DType::Q8_0:
      return true;
  }
  return false;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::Q4_0:
      return "Q4_0";
    case DType::Q8_0:
      return "Q8_0";
  }
  return "unknown";
}

int64_t dtype_block_elems(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
      return 1;
    case DType::Q4_0:
    case DType::Q8_0:
      return kQK;
  }
  throw Error(Errc::unsupported, "unknown dtype " + std::to_string(static_cast<uint32_t>(t)));
}

size_t dtype_block_bytes(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::F16:
      return 2;
    case DType::Q4_0:
      return 18;
    case DType::Q8_0:
      return 34;
  }
  throw Error(Errc::unsupported, "unknown dtype " + std::to_string(static_cast<uint32_t>(t)));
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
