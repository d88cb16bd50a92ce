#pragma once
// `duet quantize`: a GGUF of F32/F16/BF16 matrices rewritten in a quantisation preset
// (core/model/quant_mix.h: llama.cpp's per-tensor rules), every metadata key copied,
// general.file_type set to the preset's, the tensors streamed row by row (never a whole dequantised
// model in memory), with each tensor's RMSE against its source.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/model/dtype.h"

namespace duet {

struct QuantizeOptions {
  std::string type;   // a quant_mix preset name: q4_k_m, q5_k_m, q6_k, q8_0, q4_0, ...
  bool pure = false;  // no mixing rules (llama-quantize --pure)
  int n_threads = 2;
  // Called from the writing thread after each chunk of rows: source bytes done so far, total,
  // and the tensor being written.
  std::function<void(uint64_t done, uint64_t total, const std::string& tensor)> progress;
};

struct QuantizedTensor {
  std::string name;
  std::vector<int64_t> dims;
  DType from, to;
  double rmse;     // sqrt(mean (source - dequantised result)^2); 0 for tensors copied as they were
  uint64_t bytes;  // in the output
};

struct QuantizeReport {
  uint32_t file_type = 0;
  uint64_t in_bytes = 0, out_bytes = 0;  // tensor data
  std::vector<QuantizedTensor> tensors;  // in file order
};

// Throws duet::Error: invalid_argument for an unknown type, unsupported for a source matrix that
// is already quantised when the preset quantises (name and type in the message; a float preset
// dequantises any type), io/bad_format from the reader or writer.
QuantizeReport quantize_file(const std::string& in, const std::string& out,
                             const QuantizeOptions& options);

}  // namespace duet
