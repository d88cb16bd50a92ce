#include "core/model/quantize_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "core/base/error.h"
#include "core/base/thread_pool.h"
#include "core/model/gguf.h"
#include "core/model/gguf_writer.h"
#include "core/model/quant.h"
#include "core/model/quant_mix.h"

namespace duet {
namespace {

bool is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

}  // namespace

QuantizeReport quantize_file(const std::string& in, const std::string& out,
                             const QuantizeOptions& options) {
  const QuantPreset preset =
      options.pure ? pure(quant_preset(options.type)) : quant_preset(options.type);
  if (options.n_threads < 1)
    throw Error(Errc::invalid_argument, "quantize: threads must be positive");
  const auto src = GgufFile::open(in);
  std::vector<TensorDesc> descs;
  for (const GgufTensorInfo& t : src->tensors()) descs.push_back({t.name, t.dims, t.type});
  const std::vector<DType> types = choose_tensor_types(preset, descs);

  QuantizeReport report;
  report.file_type = preset.file_type;
  GgufWriter w;
  for (const std::string& key : src->keys()) {
    if (key == "general.alignment") continue;  // the writer's own (32)
    w.set_value(key, src->value(key));
  }
  w.set_uint32("general.file_type", preset.file_type);
  w.set_uint32("general.quantization_version", 2);  // ggml's, as llama-quantize writes

  ThreadPool pool(options.n_threads);
  // Per-row squared errors: summed in row order after writing, so the RMSE does not depend on
  // the thread count.
  std::vector<std::vector<double>> row_sse(src->tensors().size());
  uint64_t total = 0, done = 0;
  for (const GgufTensorInfo& t : src->tensors()) total += t.bytes;
  for (size_t i = 0; i < src->tensors().size(); ++i) {
    const GgufTensorInfo& t = src->tensors()[i];
    const DType to = types[i];
    const int64_t cols = t.dims[0];
    const int64_t rows = static_cast<int64_t>(t.bytes / dtype_row_bytes(t.type, cols));
    // Requantising compounds two errors, so quantised sources are refused; expanding one to a
    // float type (f32/f16/bf16 presets) is exact for F32 and allowed: the noise measurements
    // run llama.cpp on a quantised file's F32 expansion (tools/llamacpp-oracle).
    if (to != t.type && !is_float(t.type) && !is_float(to)) {
      throw Error(Errc::unsupported, in + ": tensor \"" + t.name + "\" is " +
                                         std::string(dtype_name(t.type)) +
                                         "; duet quantize reads F32, F16 and BF16 matrices");
    }
    report.tensors.push_back(
        {t.name, t.dims, t.type, to, 0.0, static_cast<uint64_t>(rows) * dtype_row_bytes(to, cols)});
    report.in_bytes += t.bytes;
    report.out_bytes += report.tensors.back().bytes;
    const size_t src_row = dtype_row_bytes(t.type, cols), dst_row = dtype_row_bytes(to, cols);
    std::vector<double>* sse = &row_sse[i];
    sse->assign(static_cast<size_t>(rows), 0.0);
    const std::string name = t.name;
    const uint8_t* data = t.data;
    const DType from = t.type;
    w.add_tensor_rows(t.name, to, t.dims,
                      [&, sse, name, data, from, to, cols, src_row, dst_row](
                          int64_t row0, int64_t n_rows, uint8_t* dst) {
                        if (to == from) {
                          std::memcpy(dst, data + static_cast<size_t>(row0) * src_row,
                                      static_cast<size_t>(n_rows) * src_row);
                        } else {
                          pool.parallel_for(n_rows, 4, [&](int64_t begin, int64_t end) {
                            std::vector<float> x(static_cast<size_t>(cols)), back(x.size());
                            for (int64_t r = begin; r < end; ++r) {
                              const int64_t row = row0 + r;
                              dequantize_row(from, data + static_cast<size_t>(row) * src_row,
                                             x.data(), cols);
                              uint8_t* q = dst + static_cast<size_t>(r) * dst_row;
                              quantize_row(to, x.data(), q, cols);
                              dequantize_row(to, q, back.data(), cols);
                              double s = 0;
                              for (int64_t k = 0; k < cols; ++k) {
                                const double d = double(x[k]) - back[k];
                                s += d * d;
                              }
                              (*sse)[static_cast<size_t>(row)] = s;
                            }
                          });
                        }
                        done += static_cast<uint64_t>(n_rows) * src_row;
                        if (options.progress) options.progress(done, total, name);
                      });
  }
  w.write(out);
  for (size_t i = 0; i < report.tensors.size(); ++i) {
    double s = 0;
    for (double v : row_sse[i]) s += v;
    const double n =
        static_cast<double>(row_sse[i].size()) * static_cast<double>(report.tensors[i].dims[0]);
    report.tensors[i].rmse = n > 0 ? std::sqrt(s / n) : 0.0;
  }
  return report;
}

}  // namespace duet
