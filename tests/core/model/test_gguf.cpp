// The GGUF reader on the real tiny-fortune file, and one test per kind of bad file: each bad
// file is a copy of the real one with a few bytes patched (or cut), written to a temp dir.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/base/error.h"
#include "core/model/gguf.h"
#include "core/model/gguf_writer.h"
#include "core/model/model.h"
#include "core/model/quant.h"
#include "reference_data.h"
#include "tests/support/error_code.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using test_support::expect_error;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class BadGguf : public ::testing::Test {
 protected:
  void SetUp() override {
    bytes_ = read_bytes(testdata::fortune_model("q8_0"));
    ASSERT_GT(bytes_.size(), 1000u);
  }

  // Offset of the first occurrence of a GGUF string (u64 length + bytes) with this text; the
  // returned offset is just past the string.
  size_t after_string(const std::string& text) const {
    const uint64_t len = text.size();
    std::vector<uint8_t> needle(reinterpret_cast<const uint8_t*>(&len),
                                reinterpret_cast<const uint8_t*>(&len) + 8);
    needle.insert(needle.end(), text.begin(), text.end());
    auto it = std::search(bytes_.begin(), bytes_.end(), needle.begin(), needle.end());
    EXPECT_NE(it, bytes_.end()) << text;
    return static_cast<size_t>(it - bytes_.begin()) + needle.size();
  }
  template <class T>
  void patch(size_t offset, T value) {
    std::memcpy(bytes_.data() + offset, &value, sizeof value);
  }
  std::string write(const std::string& name) const {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes_.data()), bytes_.size());
    return path;
  }
  void expect_open_error(const std::string& name, Errc code, const std::string& problem) const {
    const std::string path = write(name);
    expect_error([&] { GgufFile::open(path); }, code, problem);
    expect_error([&] { GgufFile::open(path); }, code, path);  // the message names the file
  }

  test_support::TempDir tmp_{"duet-gguf-test"};
  const fs::path dir_ = tmp_.path();
  std::vector<uint8_t> bytes_;
};

TEST(Gguf, ReadsTheTinyFortuneFile) {
  const auto f = GgufFile::open(testdata::fortune_model("q8_0"));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_uint("llama.block_count"), 6u);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 2048u);
  const GgufTensorInfo& q = f->tensor("blk.0.attn_q.weight");
  EXPECT_EQ(q.type, DType::Q8_0);
  EXPECT_EQ(q.dims, (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(q.bytes, 256u * 256 / 32 * 34);
  EXPECT_EQ(q.data, f->data() + q.offset);
  EXPECT_EQ(q.offset % 32, 0u);
  EXPECT_EQ(f->find_tensor("nope"), nullptr);
  EXPECT_THROW(f->tensor("nope"), Error);
  EXPECT_THROW(f->get_uint("general.architecture"), Error);  // a string is not an integer
}

TEST_F(BadGguf, MissingFile) {
  expect_error([&] { GgufFile::open((dir_ / "absent.gguf").string()); }, Errc::not_found,
               "absent.gguf: cannot open");
}

TEST_F(BadGguf, BadMagic) {
  bytes_[0] = 'X';
  expect_open_error("magic.gguf", Errc::bad_format, "bad magic");
}

TEST_F(BadGguf, UnsupportedVersion) {
  patch<uint32_t>(4, 4);
  expect_open_error("version.gguf", Errc::unsupported, "unsupported GGUF version 4");
}

TEST_F(BadGguf, TruncatedHeader) {
  bytes_.resize(20);
  expect_open_error("short.gguf", Errc::bad_format, "truncated header");
  bytes_ = read_bytes(testdata::fortune_model("q8_0"));
  bytes_.resize(after_string("tokenizer.ggml.tokens") + 20000);  // cut inside the vocabulary
  expect_open_error("cut.gguf", Errc::bad_format, "runs past the end of the file");
}

TEST_F(BadGguf, StringLengthPastTheEnd) {
  patch<uint64_t>(24, uint64_t{1} << 40);  // the first metadata key's length
  expect_open_error("string.gguf", Errc::bad_format,
                    "metadata key #0 length 1099511627776 runs past the end");
}

TEST_F(BadGguf, ArrayLengthPastTheEnd) {
  const size_t at =
      after_string("tokenizer.ggml.tokens");  // then type u32, element type u32, count u64
  patch<uint64_t>(at + 8, uint64_t{1} << 50);
  expect_open_error("array.gguf", Errc::bad_format, "\"tokenizer.ggml.tokens\" array length");
}

TEST_F(BadGguf, TensorDataPastTheEnd) {
  bytes_.resize(bytes_.size() - 1000);
  expect_open_error("data.gguf", Errc::bad_format, "runs past the end of the file");
}

TEST_F(BadGguf, UnknownTensorType) {
  const size_t at = after_string("blk.0.attn_q.weight");  // then n_dims u32, 2 dims u64, type u32
  patch<uint32_t>(at + 4 + 16, 10);                       // Q2_K
  expect_open_error("type.gguf", Errc::unsupported,
                    "\"blk.0.attn_q.weight\" has unknown or unsupported tensor type 10");
}

TEST_F(BadGguf, AbsurdCounts) {
  patch<uint64_t>(8, uint64_t{1} << 40);
  expect_open_error("tensors.gguf", Errc::bad_format, "absurd tensor count");
  bytes_ = read_bytes(testdata::fortune_model("q8_0"));
  patch<uint64_t>(16, uint64_t{1} << 60);
  expect_open_error("kvs.gguf", Errc::bad_format, "absurd metadata count");
}

TEST_F(BadGguf, AbsurdTensorSize) {
  const size_t at = after_string("blk.0.attn_q.weight");
  patch<uint64_t>(at + 4 + 8, uint64_t{1} << 39);  // ne1: far more bytes than the file has
  expect_open_error("huge.gguf", Errc::bad_format, "\"blk.0.attn_q.weight\" is absurdly large");
}

TEST_F(BadGguf, MissingTensor) {
  const size_t at = after_string("blk.3.ffn_up.weight");
  bytes_[at - 8] = 'q';  // "blk.3.ffn_uq.weight"
  const std::string path = write("missing.gguf");
  expect_error([&] { LlamaModel::load(path); }, Errc::not_found,
               "tensor \"blk.3.ffn_up.weight\" is missing");
}

TEST_F(BadGguf, DimsThatDisagreeWithTheHyperparameters) {
  const size_t at = after_string("blk.0.attn_k.weight");  // [256, 128]: make it [256, 64]
  patch<uint64_t>(at + 4 + 8, 64);
  const std::string path = write("dims.gguf");
  expect_error(
      [&] { LlamaModel::load(path); }, Errc::bad_format,
      "\"blk.0.attn_k.weight\" has dims [256, 64] but the hyperparameters need [256, 128]");
}

TEST_F(BadGguf, HyperparameterThatDisagreesWithTheTensors) {
  const size_t at = after_string("llama.feed_forward_length");  // then type u32, value
  patch<uint32_t>(at + 4, 512);
  const std::string path = write("ffn.gguf");
  expect_error([&] { LlamaModel::load(path); }, Errc::bad_format,
               "\"blk.0.ffn_gate.weight\" has dims [256, 704]");
}

TEST_F(BadGguf, NonFiniteScaleIsALoadError) {
  // blk.0.attn_q.weight is Q8_0 [256, 256] in the fortune file: find its data and make the scale
  // of row 1's block 3 an fp16 NaN.
  const auto f = GgufFile::open(testdata::fortune_model("q8_0"));
  const GgufTensorInfo& t = f->tensor("blk.0.attn_q.weight");
  ASSERT_EQ(t.type, DType::Q8_0);
  const size_t block = static_cast<size_t>(t.dims[0] / 32 + 3);
  patch<uint16_t>(t.offset + block * sizeof(BlockQ8_0), 0x7e00);
  const std::string path = write("nan.gguf");
  expect_error([&] { LlamaModel::load(path); }, Errc::bad_format,
               "\"blk.0.attn_q.weight\" (Q8_0) row 1 block 3 has a scale that is not finite");
  patch<uint16_t>(t.offset + block * sizeof(BlockQ8_0), 0xfc00);  // -Inf
  const std::string inf = write("inf.gguf");
  expect_error([&] { LlamaModel::load(inf); }, Errc::bad_format, "not finite");
}

// A one-tensor file of a K type: [cols, rows] of rows x cols random weights, quantised.
std::string write_k_file(const fs::path& dir, DType type, int64_t cols, int64_t rows) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  std::vector<float> x(static_cast<size_t>(cols * rows));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i) * 0.37f);
  std::vector<uint8_t> q(static_cast<size_t>(rows) * dtype_row_bytes(type, cols));
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(type, x.data() + r * cols, q.data() + r * dtype_row_bytes(type, cols), cols);
  w.add_tensor("w", type, {cols, rows}, std::move(q));
  const std::string path = (dir / (std::string(dtype_name(type)) + ".gguf")).string();
  w.write(path);
  return path;
}

TEST_F(BadGguf, KQuantRowsMustBeWholeSuperBlocks) {
  for (DType type : {DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const std::string path = write_k_file(dir_, type, 512, 3);
    bytes_ = read_bytes(path);
    const auto f = GgufFile::open(path);
    EXPECT_EQ(f->tensor("w").bytes, 3 * 2 * dtype_block_bytes(type));
    const size_t at = after_string("w");  // then n_dims u32, ne0 u64
    patch<uint64_t>(at + 4, 384);         // 1.5 super-blocks per row
    expect_open_error("rows.gguf", Errc::bad_format,
                      "row of 384 elements is not a whole number of " +
                          std::string(dtype_name(type)) + " blocks (256 weights each)");
  }
}

TEST_F(BadGguf, TruncatedSuperBlock) {
  for (DType type : {DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    bytes_ = read_bytes(write_k_file(dir_, type, 256, 4));
    bytes_.resize(bytes_.size() - dtype_block_bytes(type) / 2);  // half of the last super-block
    expect_open_error("cut.gguf", Errc::bad_format, "\"w\" data");
    expect_open_error("cut.gguf", Errc::bad_format, "runs past the end of the file");
  }
}

}  // namespace
}  // namespace duet
