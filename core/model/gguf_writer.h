#pragma once
// Writes GGUF v3 files (the layout core/model/gguf.h reads): header, key/values in the order they
// were first set, tensor infos in the order they were added, then the tensor data, each tensor
// aligned to general.alignment = 32 bytes. The file is written to "<path>.tmp" and renamed into
// place, so a failed write never leaves a half file under the real name.
//
// Tensors come either as bytes (add_tensor) or from a row source (add_tensor_rows) that is asked
// for a few MiB of rows at a time during write(), so a multi-GB model is generated straight to
// disk without ever being held in memory.
#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "core/model/dtype.h"
#include "core/model/gguf.h"

namespace duet {

class GgufWriter {
 public:
  static constexpr uint32_t kAlignment = 32;

  // Fills rows [row_begin, row_begin + n_rows) of a tensor into dst, already in the tensor's type
  // (a row is dims[0] elements; rows are all the other dims flattened).
  using RowSource = std::function<void(int64_t row_begin, int64_t n_rows, uint8_t* dst)>;

  // Setting a key twice replaces its value (and keeps its first position).
  void set_uint32(std::string key, uint32_t v);
  void set_uint64(std::string key, uint64_t v);
  void set_float32(std::string key, float v);
  void set_bool(std::string key, bool v);
  void set_string(std::string key, std::string v);
  void set_string_array(std::string key, std::vector<std::string> v);
  void set_float32_array(std::string key, std::vector<float> v);
  void set_int32_array(std::string key, std::vector<int32_t> v);
  // A value read from another GGUF, written with its own type (copying metadata such as a
  // tokenizer). Throws invalid_argument for arrays of arrays, which the reader does not keep.
  void set_value(std::string key, GgufValue v);

  // dims[0] innermost. Data is written as given (already quantised for Q types); its size must be
  // exactly what type and dims call for. Throws invalid_argument on a duplicate name, a bad shape
  // or a size mismatch.
  void add_tensor(std::string name, DType type, std::vector<int64_t> dims,
                  std::vector<uint8_t> data);
  void add_tensor_rows(std::string name, DType type, std::vector<int64_t> dims, RowSource source);

  void write(const std::string& path) const;  // throws duet::Error (io) naming the path

  // Bytes the tensor data of a (type, dims) takes; throws invalid_argument on a bad shape.
  static uint64_t tensor_bytes(DType type, const std::vector<int64_t>& dims);

 private:
  using Value = std::variant<uint32_t, uint64_t, float, bool, std::string, std::vector<std::string>,
                             std::vector<float>, std::vector<int32_t>, GgufValue>;
  struct KeyValue {
    std::string key;
    Value value;
  };
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> dims;
    uint64_t bytes;
    std::vector<uint8_t> data;  // empty when `source` produces the rows
    RowSource source;
  };

  void set(std::string key, Value v);
  void add(Tensor t);

  std::vector<KeyValue> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace duet
