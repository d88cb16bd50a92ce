#pragma once
// Setting a kernel's arguments and rounding launch sizes: what every file that launches kernels
// (gpu_kernels*.cpp) shares.
#include <CL/cl.h>

#include <cstddef>

#include "services/gpu_svc/cl_device.h"

namespace duet::gpu {

// A __local argument of n bytes.
struct LocalBytes {
  size_t n;
};

inline void set_arg(cl_kernel k, cl_uint i, const LocalBytes& v) {
  check_cl(clSetKernelArg(k, i, v.n, nullptr), "clSetKernelArg(local)");
}
template <typename T>
void set_arg(cl_kernel k, cl_uint i, const T& v) {
  check_cl(clSetKernelArg(k, i, sizeof(T), &v), "clSetKernelArg");
}
// Arguments 0, 1, ... in order.
template <typename... A>
void set_args(cl_kernel k, const A&... a) {
  cl_uint i = 0;
  (set_arg(k, i++, a), ...);
}

inline size_t round_up(size_t v, size_t m) {
  return (v + m - 1) / m * m;
}

}  // namespace duet::gpu
