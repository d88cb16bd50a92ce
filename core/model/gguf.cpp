#include "core/model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "core/base/error.h"

namespace duet {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxDims = 4;                  // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 4;
// The smallest possible encodings bound how many entries a file of a given size can hold.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // empty key, type, a u8
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims 0, type, offset

std::string type_name(GgufType t) {
  static const char* names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                "bool", "string", "array", "u64", "i64", "f64"};
  const auto raw = static_cast<uint32_t>(t);
  return raw < 13 ? names[raw] : "type " + std::to_string(raw);
}

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::BOOL:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      return 8;
    default:
      return 0;
  }
}

bool is_signed(GgufType t) {
  return t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64;
}
bool is_float(GgufType t) {
  return t == GgufType::F32 || t == GgufType::F64;
}

}  // namespace

// Reads the header with a cursor that refuses to move past the end of the file.
class GgufParser {
 public:
  explicit GgufParser(GgufFile& f) : f_(f) {}

  void parse() {
    if (f_.size_ < 24)
      fail("truncated header: " + std::to_string(f_.size_) + " bytes, a GGUF header needs 24");
    const uint32_t magic = read<uint32_t>("magic");
    if (magic != kGgufMagic)
      fail("bad magic: not a GGUF file (first bytes are not \"GGUF\")", Errc::bad_format);
    f_.version_ = read<uint32_t>("version");
    if (f_.version_ != 2 && f_.version_ != 3) {
      fail("unsupported GGUF version " + std::to_string(f_.version_) +
               " (duet reads versions 2 and 3)",
           Errc::unsupported);
    }
    const uint64_t n_tensors = read<uint64_t>("tensor count");
    const uint64_t n_kv = read<uint64_t>("metadata count");
    if (n_tensors > f_.size_ / kMinTensorInfoBytes) {
      fail("absurd tensor count " + std::to_string(n_tensors) + ": more than a file of " +
           std::to_string(f_.size_) + " bytes could hold");
    }
    if (n_kv > f_.size_ / kMinKvBytes) {
      fail("absurd metadata count " + std::to_string(n_kv) + ": more than a file of " +
           std::to_string(f_.size_) + " bytes could hold");
    }
    for (uint64_t i = 0; i < n_kv; ++i) read_kv(i);
    if (auto it = f_.kv_.find("general.alignment"); it != f_.kv_.end()) {
      const GgufValue& v = it->second;
      if (v.type != GgufType::U32 || v.u == 0 || (v.u & (v.u - 1)) != 0)
        fail("general.alignment must be a u32 power of two");
      f_.alignment_ = v.u;
    }
    std::vector<uint64_t> rel_offsets;
    for (uint64_t i = 0; i < n_tensors; ++i) rel_offsets.push_back(read_tensor_info(i));
    const uint64_t data_start = (pos_ + f_.alignment_ - 1) / f_.alignment_ * f_.alignment_;
    for (size_t i = 0; i < f_.tensors_.size(); ++i)
      place_tensor(f_.tensors_[i], rel_offsets[i], data_start);
  }

 private:
  [[noreturn]] void fail(const std::string& problem, Errc code = Errc::bad_format) const {
    throw Error(code, f_.path_ + ": " + problem);
  }

  void need(uint64_t n, const std::string& what) const {
    if (n > f_.size_ - pos_) {
      fail("truncated file: " + what + " needs " + std::to_string(n) + " bytes at offset " +
           std::to_string(pos_) + " but the file ends at " + std::to_string(f_.size_));
    }
  }

  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, f_.base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const std::string& what) {
    const uint64_t len = read<uint64_t>(what + " length");
    if (len > f_.size_ - pos_) {
      fail(what + " length " + std::to_string(len) + " runs past the end of the file (offset " +
           std::to_string(pos_) + ", file size " + std::to_string(f_.size_) + ")");
    }
    std::string s(reinterpret_cast<const char*>(f_.base_ + pos_), len);
    pos_ += len;
    return s;
  }

  GgufType read_type(const std::string& what) {
    const uint32_t raw = read<uint32_t>(what + " type");
    if (raw > static_cast<uint32_t>(GgufType::F64))
      fail(what + " has unknown value type " + std::to_string(raw));
    return static_cast<GgufType>(raw);
  }

  // One scalar into v's scalar fields.
  void read_scalar(GgufType t, GgufValue& v, const std::string& what) {
    switch (t) {
      case GgufType::U8:
        v.u = read<uint8_t>(what);
        break;
      case GgufType::BOOL:
        v.u = read<uint8_t>(what);
        break;
      case GgufType::U16:
        v.u = read<uint16_t>(what);
        break;
      case GgufType::U32:
        v.u = read<uint32_t>(what);
        break;
      case GgufType::U64:
        v.u = read<uint64_t>(what);
        break;
      case GgufType::I8:
        v.i = read<int8_t>(what);
        break;
      case GgufType::I16:
        v.i = read<int16_t>(what);
        break;
      case GgufType::I32:
        v.i = read<int32_t>(what);
        break;
      case GgufType::I64:
        v.i = read<int64_t>(what);
        break;
      case GgufType::F32:
        v.f = read<float>(what);
        break;
      case GgufType::F64:
        v.f = read<double>(what);
        break;
      case GgufType::STRING:
        v.s = read_string(what);
        break;
      case GgufType::ARRAY:
        fail("internal: array read as scalar", Errc::internal);
    }
  }

  void read_array(GgufValue& v, const std::string& what, int depth) {
    if (depth > kMaxArrayDepth)
      fail(what + ": arrays nested deeper than " + std::to_string(kMaxArrayDepth));
    v.elem_type = read_type(what + " element");
    v.count = read<uint64_t>(what + " count");
    const uint64_t remaining = f_.size_ - pos_;
    const uint64_t min_elem = v.elem_type == GgufType::STRING  ? 8
                              : v.elem_type == GgufType::ARRAY ? 12
                                                               : scalar_size(v.elem_type);
    if (v.count > remaining / min_elem) {
      fail(what + " array length " + std::to_string(v.count) + " runs past the end of the file (" +
           std::to_string(remaining) + " bytes left)");
    }
    for (uint64_t k = 0; k < v.count; ++k) {
      GgufValue e;
      if (v.elem_type == GgufType::ARRAY) {
        read_array(e, what + "[" + std::to_string(k) + "]", depth + 1);
        continue;
      }
      read_scalar(v.elem_type, e, what);
      if (v.elem_type == GgufType::STRING)
        v.strings.push_back(std::move(e.s));
      else if (is_float(v.elem_type))
        v.floats.push_back(e.f);
      else
        v.ints.push_back(is_signed(v.elem_type) ? e.i : static_cast<int64_t>(e.u));
    }
  }

  void read_kv(uint64_t index) {
    std::string key = read_string("metadata key #" + std::to_string(index));
    GgufValue v;
    v.type = read_type("metadata \"" + key + "\"");
    if (v.type == GgufType::ARRAY)
      read_array(v, "metadata \"" + key + "\"", 1);
    else
      read_scalar(v.type, v, "metadata \"" + key + "\"");
    if (!f_.kv_.emplace(key, std::move(v)).second) fail("duplicate metadata key \"" + key + "\"");
  }

  uint64_t read_tensor_info(uint64_t index) {
    GgufTensorInfo t;
    t.name = read_string("tensor #" + std::to_string(index) + " name");
    const std::string what = "tensor \"" + t.name + "\"";
    const uint32_t n_dims = read<uint32_t>(what + " dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      fail(what + " has " + std::to_string(n_dims) + " dimensions (1..4 allowed)");
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = read<uint64_t>(what + " dimension");
      if (ne == 0 || ne > (1ull << 40) || n_elems > std::numeric_limits<uint64_t>::max() / ne) {
        fail(what + " has an absurd dimension " + std::to_string(ne));
      }
      n_elems *= ne;
      t.dims.push_back(static_cast<int64_t>(ne));
    }
    const uint32_t raw_type = read<uint32_t>(what + " type");
    if (!dtype_known(raw_type)) {
      fail(what + " has unknown or unsupported tensor type " + std::to_string(raw_type) +
               " (duet reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)",
           Errc::unsupported);
    }
    t.type = static_cast<DType>(raw_type);
    if (t.dims[0] % dtype_block_elems(t.type) != 0) {
      fail(what + " row of " + std::to_string(t.dims[0]) + " elements is not a whole number of " +
           std::string(dtype_name(t.type)) + " blocks (" +
           std::to_string(dtype_block_elems(t.type)) + " weights each)");
    }
    const uint64_t rows = n_elems / static_cast<uint64_t>(t.dims[0]);
    const uint64_t row_bytes = dtype_row_bytes(t.type, t.dims[0]);
    if (rows > f_.size_ / row_bytes + 1)
      fail(what + " is absurdly large: more bytes than the file could hold");
    t.bytes = rows * row_bytes;
    const uint64_t rel_offset = read<uint64_t>(what + " offset");
    for (const auto& other : f_.tensors_)
      if (other.name == t.name) fail("duplicate tensor name \"" + t.name + "\"");
    f_.tensors_.push_back(std::move(t));
    return rel_offset;
  }

  void place_tensor(GgufTensorInfo& t, uint64_t rel_offset, uint64_t data_start) const {
    if (rel_offset % f_.alignment_ != 0) {
      fail("tensor \"" + t.name + "\" offset " + std::to_string(rel_offset) +
           " is not aligned to " + std::to_string(f_.alignment_));
    }
    if (data_start > f_.size_ || rel_offset > f_.size_ - data_start ||
        t.bytes > f_.size_ - data_start - rel_offset) {
      fail("tensor \"" + t.name + "\" data (" + std::to_string(t.bytes) + " bytes at data offset " +
           std::to_string(rel_offset) + ") runs past the end of the file (" +
           std::to_string(f_.size_) + " bytes)");
    }
    t.offset = data_start + rel_offset;
    t.data = f_.base_ + t.offset;
  }

  GgufFile& f_;
  uint64_t pos_ = 0;
};

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw Error(err == ENOENT ? Errc::not_found : Errc::io,
                path + ": cannot open: " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(Errc::io, path + ": not a regular file");
  }
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw Error(Errc::io, path + ": mmap failed: " + std::strerror(err));
    }
    f->base_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  GgufParser(*f).parse();  // on error, f's destructor unmaps
  return f;
}

GgufFile::~GgufFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

bool GgufFile::has(std::string_view key) const {
  return kv_.find(key) != kv_.end();
}

std::vector<std::string> GgufFile::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : kv_) out.push_back(k);
  return out;
}

const GgufValue& GgufFile::value(std::string_view key) const {
  auto it = kv_.find(key);
  if (it == kv_.end())
    throw Error(Errc::not_found, path_ + ": metadata key \"" + std::string(key) + "\" is missing");
  return it->second;
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, std::string_view key, GgufType got,
                             const char* want) {
  throw Error(Errc::bad_format, path + ": metadata \"" + std::string(key) + "\" is " +
                                    type_name(got) + ", expected " + want);
}
}  // namespace

uint64_t GgufFile::get_uint(std::string_view key) const {
  const GgufValue& v = value(key);
  if (is_signed(v.type)) {
    if (v.i < 0)
      throw Error(Errc::bad_format, path_ + ": metadata \"" + std::string(key) + "\" is negative");
    return static_cast<uint64_t>(v.i);
  }
  if (scalar_size(v.type) == 0 || is_float(v.type) || v.type == GgufType::BOOL)
    wrong_type(path_, key, v.type, "an integer");
  return v.u;
}

float GgufFile::get_float(std::string_view key) const {
  const GgufValue& v = value(key);
  if (!is_float(v.type)) wrong_type(path_, key, v.type, "f32 or f64");
  return static_cast<float>(v.f);
}

std::string GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::STRING) wrong_type(path_, key, v.type, "a string");
  return v.s;
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::ARRAY || v.elem_type != GgufType::STRING)
    wrong_type(path_, key, v.type, "an array of strings");
  return v.strings;
}

std::vector<float> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufType::ARRAY || !is_float(v.elem_type))
    wrong_type(path_, key, v.type, "an array of floats");
  return {v.floats.begin(), v.floats.end()};
}

std::vector<int32_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue& v = value(key);
  const bool ints =
      v.type == GgufType::ARRAY && scalar_size(v.elem_type) != 0 && !is_float(v.elem_type);
  if (!ints) wrong_type(path_, key, v.type, "an array of integers");
  std::vector<int32_t> out;
  out.reserve(v.ints.size());
  for (int64_t x : v.ints) {
    const bool fits = v.elem_type == GgufType::U64 ? static_cast<uint64_t>(x) <= INT32_MAX
                                                   : x >= INT32_MIN && x <= INT32_MAX;
    if (!fits)
      throw Error(Errc::bad_format,
                  path_ + ": metadata \"" + std::string(key) + "\" has an element outside int32");
    out.push_back(static_cast<int32_t>(x));
  }
  return out;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const GgufTensorInfo& GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t) throw Error(Errc::not_found, path_ + ": tensor \"" + std::string(name) + "\" is missing");
  return *t;
}

}  // namespace duet
