// K-quant matmuls (Q4_K, Q5_K, Q6_K weights in the file's layout; issue 19). CPU devices with the
// integer path quantise the input rows as for Q4_0/Q8_0 (quantize_q8_act, zero point 0) and run
// matmul_kq_cpu.cl's kernels; every other device, and CPU devices with the integer path off, the
// fp32 kernels of matmul_kq_gpu.cl (the GEMV for up to 4 tokens on GPUs, the 8-token GEMM else).
#include <optional>
#include <string>

#include "core/base/error.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "services/gpu_svc/kernel_args.h"

namespace duet::gpu {
cl_event GpuKernels::matmul_kq(cl_mem arena, const MatmulArgs& a) {
  if (a.k % kQK_K != 0)
    throw Error(Errc::invalid_argument,
                std::string("gpu_svc: a ") + std::string(dtype_name(a.wtype)) +
                    " weight's width must be a multiple of 256, not " + std::to_string(a.k));
  if (a.packed_rows)
    throw Error(Errc::invalid_argument, std::string("gpu_svc: ") +
                                            std::string(dtype_name(a.wtype)) +
                                            " weights have no packed layout");
  // The integer path is matmul_int8's, K kernels by name (matmul_kq_cpu.cl); tiled when a.tiled.
  if (int8_matmul_) return matmul_int8(arena, a);
  forget_quantized_input();  // the float kernels do not track their outputs
  const uint32_t n = a.tokens.count();
  const size_t rows = a.row_end > a.row_begin ? a.row_end - a.row_begin : 0;
  const std::string suffix = kernel_type_suffix(a.wtype);
  if (const std::optional<GemvPick> g = gemv_pick(a)) return gemv_gpu(arena, a, *g);
  const std::string name = "matmul_t8_" + suffix;
  cl_kernel k = dev_.kernel(name);
  set_args(k, a.w, cl_ulong{a.w_off}, cl_uint{a.k}, arena, cl_ulong{a.x_off}, cl_uint{a.x_stride},
           cl_ulong{a.y_off}, cl_uint{a.y_stride}, cl_uint{a.row_begin}, cl_uint{a.row_end},
           cl_uint{a.tokens.begin}, cl_uint{a.tokens.end}, cl_ulong{a.tok_off},
           cl_int{a.rows_from_table ? 1 : 0});
  const size_t row_group = dev_.info().type == "gpu" ? 64 : 16;
  const size_t global[2] = {round_up(rows, row_group), (n + 7) / 8};
  const size_t local[2] = {row_group, 1};
  return launch(name.c_str(), k, 2, global, local);
}

}  // namespace duet::gpu
