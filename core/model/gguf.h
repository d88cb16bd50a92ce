#pragma once
// GGUF (v2 and v3) reader. The file is mmapped read-only and never copied: tensor data pointers
// point into the mapping. Every count, length, offset and size is checked against the file's
// length before it is used, so a corrupt or hostile file gives a duet::Error naming the file and
// the problem (never a crash). Metadata is parsed eagerly at open().
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/dtype.h"

namespace duet {

struct GgufTensorInfo {
  std::string name;
  DType type;
  std::vector<int64_t> dims;  // dims[0] = ne0 (innermost, contiguous)
  uint64_t offset;            // absolute byte offset in the file
  uint64_t bytes;
  const uint8_t* data;  // points into the mmapped file
};

// GGUF metadata value types (gguf_type).
enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

struct GgufValue {
  GgufType type = GgufType::U8;
  GgufType elem_type = GgufType::U8;  // arrays only
  // Scalars: integers and bools in u (unsigned) or i (signed), floats in f, strings in s.
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string s;
  // Arrays: integer elements in ints (u64 elements bit-cast), float elements in floats,
  // strings in strings; arrays of arrays are checked and skipped (count only).
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  uint64_t count = 0;
};

class GgufFile {
 public:
  static std::unique_ptr<GgufFile> open(
      const std::string& path);  // throws duet::Error naming path + problem
  ~GgufFile();                   // munmap
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const uint8_t* data() const { return base_; }  // the whole mapped file
  uint64_t size() const { return size_; }
  uint64_t alignment() const { return alignment_; }

  bool has(std::string_view key) const;
  uint64_t get_uint(
      std::string_view key) const;  // any integer type that fits (u8..u64, i8..i64 >= 0)
  float get_float(std::string_view key) const;  // f32/f64
  std::string get_string(std::string_view key) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;
  std::vector<int32_t> get_int_array(std::string_view key) const;
  const GgufValue& value(std::string_view key) const;  // throws Errc::not_found
  std::vector<std::string> keys() const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr if absent
  const GgufTensorInfo& tensor(std::string_view name) const;       // throws Errc::not_found

 private:
  GgufFile() = default;
  friend class GgufParser;

  std::string path_;
  uint32_t version_ = 0;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue, std::less<>> kv_;
  std::vector<GgufTensorInfo> tensors_;
};

}  // namespace duet
