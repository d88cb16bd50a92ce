#include "core/model/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "core/base/error.h"

namespace duet {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kGgufVersion = 3;
constexpr size_t kMaxDims = 4;                  // GGML_MAX_DIMS
constexpr uint64_t kRowChunkBytes = 16u << 20;  // row sources are asked for about this much at once

uint64_t align_up(uint64_t n, uint64_t a) {
  return (n + a - 1) / a * a;
}

// Little-endian serialisation into a byte string (GGUF is little-endian; so is every host we run
// on).
class Buffer {
 public:
  template <class T>
  void pod(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes_.append(s);
  }
  void pad_to(uint64_t alignment) { bytes_.resize(align_up(bytes_.size(), alignment), '\0'); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

// A file being written: every failure names the path and the OS's reason.
class OutFile {
 public:
  explicit OutFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create");
  }
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("cannot write");
      p += w;
      n -= static_cast<size_t>(w);
      written_ += static_cast<uint64_t>(w);
    }
  }
  void pad_to(uint64_t alignment) {
    static const uint8_t zeros[GgufWriter::kAlignment] = {};
    write(zeros, align_up(written_, alignment) - written_);
  }
  void close() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("cannot close");
  }
  uint64_t written() const { return written_; }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw Error(Errc::io,
                std::string("gguf writer: ") + what + " " + path_ + ": " + std::strerror(errno));
  }
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

// One scalar of type t: integers from u (unsigned, bool) or i (signed), floats from f.
void write_scalar(Buffer& b, GgufType t, uint64_t u, int64_t i, double f, const std::string& s) {
  switch (t) {
    case GgufType::U8:
    case GgufType::BOOL:
      b.pod<uint8_t>(static_cast<uint8_t>(u));
      break;
    case GgufType::U16:
      b.pod<uint16_t>(static_cast<uint16_t>(u));
      break;
    case GgufType::U32:
      b.pod<uint32_t>(static_cast<uint32_t>(u));
      break;
    case GgufType::U64:
      b.pod<uint64_t>(u);
      break;
    case GgufType::I8:
      b.pod<int8_t>(static_cast<int8_t>(i));
      break;
    case GgufType::I16:
      b.pod<int16_t>(static_cast<int16_t>(i));
      break;
    case GgufType::I32:
      b.pod<int32_t>(static_cast<int32_t>(i));
      break;
    case GgufType::I64:
      b.pod<int64_t>(i);
      break;
    case GgufType::F32:
      b.pod<float>(static_cast<float>(f));
      break;
    case GgufType::F64:
      b.pod<double>(f);
      break;
    case GgufType::STRING:
      b.str(s);
      break;
    case GgufType::ARRAY:
      throw Error(Errc::internal, "gguf writer: array written as a scalar");
  }
}

bool is_signed_type(GgufType t) {
  return t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64;
}

// A value as GgufFile read it (core/model/gguf.h): arrays keep their elements in strings, floats or
// ints (unsigned elements bit-cast into int64).
void write_value(Buffer& b, const GgufValue& v) {
  b.pod<uint32_t>(static_cast<uint32_t>(v.type));
  if (v.type != GgufType::ARRAY) {
    write_scalar(b, v.type, v.u, v.i, v.f, v.s);
    return;
  }
  b.pod<uint32_t>(static_cast<uint32_t>(v.elem_type));
  const GgufType e = v.elem_type;
  if (e == GgufType::STRING) {
    b.pod<uint64_t>(v.strings.size());
    for (const auto& s : v.strings) b.str(s);
  } else if (e == GgufType::F32 || e == GgufType::F64) {
    b.pod<uint64_t>(v.floats.size());
    for (double f : v.floats) write_scalar(b, e, 0, 0, f, {});
  } else {
    b.pod<uint64_t>(v.ints.size());
    for (int64_t x : v.ints)
      write_scalar(b, e, is_signed_type(e) ? 0 : static_cast<uint64_t>(x),
                   is_signed_type(e) ? x : 0, 0, {});
  }
}

}  // namespace

void GgufWriter::set(std::string key, Value v) {
  if (key.empty()) throw Error(Errc::invalid_argument, "gguf writer: empty key");
  for (auto& kv : kvs_) {
    if (kv.key == key) {
      kv.value = std::move(v);
      return;
    }
  }
  kvs_.push_back({std::move(key), std::move(v)});
}

void GgufWriter::set_uint32(std::string key, uint32_t v) {
  set(std::move(key), v);
}
void GgufWriter::set_uint64(std::string key, uint64_t v) {
  set(std::move(key), v);
}
void GgufWriter::set_float32(std::string key, float v) {
  set(std::move(key), v);
}
void GgufWriter::set_bool(std::string key, bool v) {
  set(std::move(key), v);
}
void GgufWriter::set_string(std::string key, std::string v) {
  set(std::move(key), std::move(v));
}
void GgufWriter::set_string_array(std::string key, std::vector<std::string> v) {
  set(std::move(key), std::move(v));
}
void GgufWriter::set_float32_array(std::string key, std::vector<float> v) {
  set(std::move(key), std::move(v));
}
void GgufWriter::set_int32_array(std::string key, std::vector<int32_t> v) {
  set(std::move(key), std::move(v));
}

void GgufWriter::set_value(std::string key, GgufValue v) {
  if (v.type == GgufType::ARRAY && v.elem_type == GgufType::ARRAY)
    throw Error(Errc::invalid_argument, "gguf writer: " + key + " is an array of arrays");
  set(std::move(key), std::move(v));
}

uint64_t GgufWriter::tensor_bytes(DType type, const std::vector<int64_t>& dims) {
  if (!dtype_known(static_cast<uint32_t>(type))) {
    throw Error(Errc::invalid_argument,
                "gguf writer: unknown tensor type " + std::to_string(static_cast<uint32_t>(type)));
  }
  if (dims.empty() || dims.size() > kMaxDims) {
    throw Error(Errc::invalid_argument,
                "gguf writer: a tensor needs 1 to 4 dims, got " + std::to_string(dims.size()));
  }
  uint64_t rows = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] <= 0)
      throw Error(Errc::invalid_argument,
                  "gguf writer: dim " + std::to_string(i) + " is not positive");
    if (i > 0) {
      if (rows > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dims[i])) {
        throw Error(Errc::invalid_argument, "gguf writer: tensor element count overflows");
      }
      rows *= static_cast<uint64_t>(dims[i]);
    }
  }
  if (dims[0] % dtype_block_elems(type) != 0) {
    throw Error(Errc::invalid_argument, "gguf writer: row length " + std::to_string(dims[0]) +
                                            " is not a multiple of " +
                                            std::string(dtype_name(type)) + "'s block of " +
                                            std::to_string(dtype_block_elems(type)));
  }
  const uint64_t row_bytes = dtype_row_bytes(type, dims[0]);
  if (rows > std::numeric_limits<uint64_t>::max() / row_bytes) {
    throw Error(Errc::invalid_argument, "gguf writer: tensor byte count overflows");
  }
  return rows * row_bytes;
}

void GgufWriter::add(Tensor t) {
  if (t.name.empty()) throw Error(Errc::invalid_argument, "gguf writer: empty tensor name");
  for (const auto& other : tensors_) {
    if (other.name == t.name)
      throw Error(Errc::invalid_argument, "gguf writer: duplicate tensor " + t.name);
  }
  tensors_.push_back(std::move(t));
}

void GgufWriter::add_tensor(std::string name, DType type, std::vector<int64_t> dims,
                            std::vector<uint8_t> data) {
  const uint64_t bytes = tensor_bytes(type, dims);
  if (data.size() != bytes) {
    throw Error(Errc::invalid_argument,
                "gguf writer: tensor " + name + " has " + std::to_string(data.size()) +
                    " bytes of data, its type and dims need " + std::to_string(bytes));
  }
  add({std::move(name), type, std::move(dims), bytes, std::move(data), nullptr});
}

void GgufWriter::add_tensor_rows(std::string name, DType type, std::vector<int64_t> dims,
                                 RowSource source) {
  if (!source)
    throw Error(Errc::invalid_argument, "gguf writer: tensor " + name + " has no row source");
  const uint64_t bytes = tensor_bytes(type, dims);
  add({std::move(name), type, std::move(dims), bytes, {}, std::move(source)});
}

void GgufWriter::write(const std::string& path) const {
  Buffer header;
  header.pod<uint32_t>(kGgufMagic);
  header.pod<uint32_t>(kGgufVersion);
  header.pod<uint64_t>(tensors_.size());
  const bool has_alignment_key = std::any_of(
      kvs_.begin(), kvs_.end(), [](const KeyValue& kv) { return kv.key == "general.alignment"; });
  header.pod<uint64_t>(kvs_.size() + (has_alignment_key ? 0 : 1));
  if (!has_alignment_key) {
    header.str("general.alignment");
    header.pod(GgufType::U32);
    header.pod<uint32_t>(kAlignment);
  }
  for (const auto& kv : kvs_) {
    if (kv.key == "general.alignment" && (!std::holds_alternative<uint32_t>(kv.value) ||
                                          std::get<uint32_t>(kv.value) != kAlignment)) {
      throw Error(Errc::invalid_argument, "gguf writer: general.alignment must be uint32 32");
    }
    header.str(kv.key);
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, uint32_t>) {
            header.pod(GgufType::U32);
            header.pod(v);
          } else if constexpr (std::is_same_v<T, uint64_t>) {
            header.pod(GgufType::U64);
            header.pod(v);
          } else if constexpr (std::is_same_v<T, float>) {
            header.pod(GgufType::F32);
            header.pod(v);
          } else if constexpr (std::is_same_v<T, bool>) {
            header.pod(GgufType::BOOL);
            header.pod<uint8_t>(v ? 1 : 0);
          } else if constexpr (std::is_same_v<T, std::string>) {
            header.pod(GgufType::STRING);
            header.str(v);
          } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            header.pod(GgufType::ARRAY);
            header.pod(GgufType::STRING);
            header.pod<uint64_t>(v.size());
            for (const auto& s : v) header.str(s);
          } else if constexpr (std::is_same_v<T, std::vector<float>>) {
            header.pod(GgufType::ARRAY);
            header.pod(GgufType::F32);
            header.pod<uint64_t>(v.size());
            for (float f : v) header.pod(f);
          } else if constexpr (std::is_same_v<T, GgufValue>) {
            write_value(header, v);
          } else {
            static_assert(std::is_same_v<T, std::vector<int32_t>>);
            header.pod(GgufType::ARRAY);
            header.pod(GgufType::I32);
            header.pod<uint64_t>(v.size());
            for (int32_t i : v) header.pod(i);
          }
        },
        kv.value);
  }
  uint64_t data_offset = 0;  // relative to the start of the data section
  for (const auto& t : tensors_) {
    header.str(t.name);
    header.pod<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) header.pod<uint64_t>(static_cast<uint64_t>(d));
    header.pod<uint32_t>(static_cast<uint32_t>(t.type));
    header.pod<uint64_t>(data_offset);
    data_offset = align_up(data_offset + t.bytes, kAlignment);
  }
  header.pad_to(kAlignment);

  const std::string tmp_path = path + ".tmp";
  try {
    OutFile out(tmp_path);
    out.write(header.bytes().data(), header.bytes().size());
    std::vector<uint8_t> chunk;
    for (const auto& t : tensors_) {
      if (t.source) {
        const int64_t n_rows = static_cast<int64_t>(t.bytes / dtype_row_bytes(t.type, t.dims[0]));
        const uint64_t row_bytes = t.bytes / static_cast<uint64_t>(n_rows);
        const int64_t rows_per_chunk =
            std::max<int64_t>(1, static_cast<int64_t>(kRowChunkBytes / row_bytes));
        for (int64_t row = 0; row < n_rows; row += rows_per_chunk) {
          const int64_t n = std::min(rows_per_chunk, n_rows - row);
          chunk.resize(static_cast<size_t>(n) * row_bytes);
          t.source(row, n, chunk.data());
          out.write(chunk.data(), chunk.size());
        }
      } else {
        out.write(t.data.data(), t.data.size());
      }
      out.pad_to(kAlignment);
    }
    out.close();
    if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
      throw Error(Errc::io, "gguf writer: cannot rename " + tmp_path + " to " + path + ": " +
                                std::strerror(errno));
    }
  } catch (...) {
    std::remove(tmp_path.c_str());
    throw;
  }
}

}  // namespace duet
