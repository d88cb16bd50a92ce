// Standalone probe (not built by CMake): does a device quantise ggml q8_0 blocks to the host's
// codes? Three ways of rounding x * id, and the division through a volatile double (vdivk),
// with gpu_svc's build options or OPTS. Found that NVIDIA folds (float)((double)a / (double)b)
// back into its inexact float division (kernels/kv_write.cl).
//   gcc -O2 -o q8probe bench/gpu/q8_div_probe.c -lOpenCL -lm && ./q8probe [blocks]
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
// Quantises N blocks of 32 random floats as ggml's quantize_row_q8_0_ref on the host and with
// three kernels on the device (-cl-mad-enable as gpu_svc builds): counts the codes that differ.
static const char* src =
  "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
  "#define DIV(a,b) ((float)((double)(a)/(double)(b)))\n"
  "kernel void plain(global const float* x, global char* q) {\n"
  "  const uint b = get_global_id(0); global const float* xb = x + b*32; float amax = 0.0f;\n"
  "  for (uint j = 0; j < 32; ++j) amax = fmax(amax, fabs(xb[j]));\n"
  "  const float d = DIV(amax, 127.0f); const float id = d != 0.0f ? DIV(1.0f, d) : 0.0f;\n"
  "  for (uint j = 0; j < 32; ++j) q[b*32+j] = (char)round(xb[j] * id); }\n"
  "kernel void vol(global const float* x, global char* q) {\n"
  "  const uint b = get_global_id(0); global const float* xb = x + b*32; float amax = 0.0f;\n"
  "  for (uint j = 0; j < 32; ++j) amax = fmax(amax, fabs(xb[j]));\n"
  "  const float d = DIV(amax, 127.0f); const float id = d != 0.0f ? DIV(1.0f, d) : 0.0f;\n"
  "  for (uint j = 0; j < 32; ++j) { volatile float v = xb[j] * id; q[b*32+j] = (char)round(v); } }\n"
  "inline float vdiv(float a, float b) { volatile double t = (double)a / (double)b; return (float)t; }\n"
  "kernel void vdivk(global const float* x, global char* q) {\n"
  "  const uint b = get_global_id(0); global const float* xb = x + b*32; float amax = 0.0f;\n"
  "  for (uint j = 0; j < 32; ++j) amax = fmax(amax, fabs(xb[j]));\n"
  "  const float d = vdiv(amax, 127.0f); const float id = d != 0.0f ? vdiv(1.0f, d) : 0.0f;\n"
  "  for (uint j = 0; j < 32; ++j) q[b*32+j] = (char)round(xb[j] * id); }\n"
  "kernel void rtz(global const float* x, global char* q) {\n"
  "  const uint b = get_global_id(0); global const float* xb = x + b*32; float amax = 0.0f;\n"
  "  for (uint j = 0; j < 32; ++j) amax = fmax(amax, fabs(xb[j]));\n"
  "  const float d = DIV(amax, 127.0f); const float id = d != 0.0f ? DIV(1.0f, d) : 0.0f;\n"
  "  for (uint j = 0; j < 32; ++j) { const float v = xb[j] * id; const float a = fabs(v);\n"
  "    const float t = trunc(a); const int r = (int)t + (a - t >= 0.5f); q[b*32+j] = (char)(v < 0 ? -r : r); } }\n";
int main(int argc, char** argv) {
  const size_t nb = argc > 1 ? atol(argv[1]) : (1 << 20), n = nb * 32;
  float* x = malloc(n * 4); signed char* want = malloc(n); signed char* got = malloc(n);
  srand(7);
  for (size_t i = 0; i < n; ++i) x[i] = ((float)rand() / RAND_MAX * 2 - 1) * (1 + (i % 7));
  for (size_t b = 0; b < nb; ++b) {
    float amax = 0; for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[b*32+j]));
    const float d = amax / 127.0f; const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j) want[b*32+j] = (signed char)roundf(x[b*32+j] * id);
  }
  cl_platform_id pl[8]; cl_uint np = 0; clGetPlatformIDs(8, pl, &np);
  for (cl_uint p = 0; p < np; ++p) {
    cl_device_id dv; if (clGetDeviceIDs(pl[p], CL_DEVICE_TYPE_ALL, 1, &dv, NULL)) continue;
    char name[256]; clGetDeviceInfo(dv, CL_DEVICE_NAME, sizeof name, name, NULL);
    cl_int e; cl_context c = clCreateContext(NULL, 1, &dv, NULL, NULL, &e);
    cl_command_queue qu = clCreateCommandQueue(c, dv, 0, &e);
    cl_program pr = clCreateProgramWithSource(c, 1, &src, NULL, &e);
    e = clBuildProgram(pr, 1, &dv, getenv("OPTS") ? getenv("OPTS") : "-cl-std=CL1.2 -cl-mad-enable", NULL, NULL);
    if (e) { char log[8192]; clGetProgramBuildInfo(pr, dv, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL); printf("%s build %d %s\n", name, e, log); continue; }
    cl_mem bx = clCreateBuffer(c, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * 4, x, &e);
    cl_mem bq = clCreateBuffer(c, CL_MEM_WRITE_ONLY, n, NULL, &e);
    const char* ks[] = {"plain", "vol", "rtz", "vdivk"};
    for (int k = 0; k < 4; ++k) {
      cl_kernel kr = clCreateKernel(pr, ks[k], &e);
      clSetKernelArg(kr, 0, sizeof bx, &bx); clSetKernelArg(kr, 1, sizeof bq, &bq);
      clEnqueueNDRangeKernel(qu, kr, 1, NULL, &nb, NULL, 0, NULL, NULL);
      clEnqueueReadBuffer(qu, bq, CL_TRUE, 0, n, got, 0, NULL, NULL);
      size_t bad = 0; for (size_t i = 0; i < n; ++i) bad += got[i] != want[i];
      printf("%s %s: %zu of %zu codes differ\n", name, ks[k], bad, n);
    }
  }
  return 0;
}
