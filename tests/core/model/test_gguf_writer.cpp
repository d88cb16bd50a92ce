// GgufWriter: what it writes, GgufFile reads back exactly; bad tensors and paths are errors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/base/error.h"
#include "core/base/fp16.h"
#include "core/model/gguf.h"
#include "core/model/gguf_writer.h"
#include "core/model/quant.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

class GgufWriterTest : public test_support::TempDirTest {
 protected:
  GgufWriterTest() : TempDirTest("duet-gguf-writer") {}
};

std::vector<uint8_t> as_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST_F(GgufWriterTest, EveryKeyTypeAndTensorReadsBackExactly) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_uint32("llama.block_count", 7);
  w.set_uint64("big", 1ull << 40);
  w.set_float32("llama.rope.freq_base", 500000.0f);
  w.set_bool("flag", true);
  w.set_string_array("names", {"<unk>",
                               "\xe2\x96\x81"
                               "a",
                               "\n", ""});
  w.set_float32_array("scores", {0.0f, -1.5f, 3.25f});
  w.set_int32_array("types", {2, 1, 4, -3});
  w.set_uint32("llama.block_count", 8);  // replaces, keeps one entry

  const std::vector<float> norm = {1.0f, 2.0f, 3.0f, 4.0f};
  w.add_tensor("norm", DType::F32, {4}, as_bytes(norm));

  std::vector<float> matrix(64 * 3);
  for (size_t i = 0; i < matrix.size(); ++i) matrix[i] = static_cast<float>(i % 17) * 0.25f - 2.0f;
  std::vector<uint8_t> q8(dtype_row_bytes(DType::Q8_0, 64) * 3);
  for (int r = 0; r < 3; ++r) {
    quantize_row(DType::Q8_0, matrix.data() + r * 64,
                 q8.data() + r * dtype_row_bytes(DType::Q8_0, 64), 64);
  }
  w.add_tensor("q8", DType::Q8_0, {64, 3}, q8);

  std::vector<uint16_t> halves(5 * 2 * 2);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = fp32_to_fp16(static_cast<float>(i));
  std::vector<uint8_t> f16(halves.size() * 2);
  std::memcpy(f16.data(), halves.data(), f16.size());
  w.add_tensor("f16", DType::F16, {5, 2, 2}, f16);

  // Rows from a source: row r is all r.
  w.add_tensor_rows("rows", DType::F32, {3, 1000}, [](int64_t row0, int64_t n, uint8_t* dst) {
    for (int64_t r = 0; r < n; ++r) {
      for (int c = 0; c < 3; ++c) {
        const auto value = static_cast<float>(row0 + r);
        std::memcpy(dst + (r * 3 + c) * sizeof(float), &value, sizeof value);
      }
    }
  });
  w.write(path("all.gguf"));
  EXPECT_FALSE(std::filesystem::exists(path("all.gguf.tmp")));

  const auto f = GgufFile::open(path("all.gguf"));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->get_uint("general.alignment"), 32u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_uint("llama.block_count"), 8u);
  EXPECT_EQ(f->keys().size(), 9u);  // 8 set + general.alignment
  EXPECT_EQ(f->get_uint("big"), 1ull << 40);
  EXPECT_EQ(f->get_float("llama.rope.freq_base"), 500000.0f);
  EXPECT_EQ(f->value("flag").type, GgufType::BOOL);
  EXPECT_EQ(f->value("flag").u, 1u);
  EXPECT_EQ(f->get_string_array("names"), (std::vector<std::string>{"<unk>",
                                                                    "\xe2\x96\x81"
                                                                    "a",
                                                                    "\n", ""}));
  EXPECT_EQ(f->get_float_array("scores"), (std::vector<float>{0.0f, -1.5f, 3.25f}));
  EXPECT_EQ(f->get_int_array("types"), (std::vector<int32_t>{2, 1, 4, -3}));

  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->tensors()[0].name, "norm");  // in the order added
  const auto& n = f->tensor("norm");
  EXPECT_EQ(n.type, DType::F32);
  EXPECT_EQ(n.dims, (std::vector<int64_t>{4}));
  EXPECT_EQ(std::memcmp(n.data, norm.data(), 16), 0);
  const auto& q = f->tensor("q8");
  EXPECT_EQ(q.type, DType::Q8_0);
  EXPECT_EQ(q.dims, (std::vector<int64_t>{64, 3}));
  ASSERT_EQ(q.bytes, q8.size());
  EXPECT_EQ(std::memcmp(q.data, q8.data(), q8.size()), 0);
  const auto& h = f->tensor("f16");
  EXPECT_EQ(h.dims, (std::vector<int64_t>{5, 2, 2}));
  EXPECT_EQ(std::memcmp(h.data, f16.data(), f16.size()), 0);
  const auto& rows = f->tensor("rows");
  ASSERT_EQ(rows.bytes, 3u * 1000u * 4u);
  for (int r : {0, 1, 500, 999}) {
    float value;
    std::memcpy(&value, rows.data + (r * 3 + 2) * sizeof(float), sizeof value);
    EXPECT_EQ(value, static_cast<float>(r));
  }
  for (const auto& t : f->tensors()) EXPECT_EQ(t.offset % 32, 0u) << t.name;
}

TEST_F(GgufWriterTest, LargeRowSourceIsWrittenInChunksInOrder) {
  // 40 MiB of F32 in rows of 4096: more than two 16 MiB chunks.
  const int64_t n_rows = 2560;
  std::vector<std::pair<int64_t, int64_t>> calls;
  GgufWriter w;
  w.add_tensor_rows("big", DType::F32, {4096, n_rows}, [&](int64_t row0, int64_t n, uint8_t* dst) {
    calls.emplace_back(row0, n);
    for (int64_t r = 0; r < n; ++r) {
      const auto value = static_cast<float>(row0 + r);
      std::memcpy(dst + r * 4096 * sizeof(float), &value, sizeof value);
    }
  });
  w.write(path("big.gguf"));
  ASSERT_GE(calls.size(), 3u);
  int64_t next = 0;
  for (const auto& [row0, n] : calls) {
    EXPECT_EQ(row0, next);
    next += n;
  }
  EXPECT_EQ(next, n_rows);
  const auto f = GgufFile::open(path("big.gguf"));
  float last;
  std::memcpy(&last, f->tensor("big").data + (n_rows - 1) * 4096 * sizeof(float), sizeof last);
  EXPECT_EQ(last, static_cast<float>(n_rows - 1));
}

TEST_F(GgufWriterTest, BadTensorsAreRejectedWhenAdded) {
  auto expect = [](auto&& fn, const std::string& needle) {
    try {
      fn();
      FAIL() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  GgufWriter w;
  w.add_tensor("a", DType::F32, {2}, std::vector<uint8_t>(8));
  expect([&] { w.add_tensor("a", DType::F32, {2}, std::vector<uint8_t>(8)); },
         "duplicate tensor a");
  expect([&] { w.add_tensor("b", DType::F32, {2}, std::vector<uint8_t>(7)); }, "7 bytes");
  expect(
      [&] {
        w.add_tensor("c", DType::Q8_0, {48, 2}, std::vector<uint8_t>(0));
      },
      "not a multiple of Q8_0's block of 32");
  expect([&] { w.add_tensor("d", DType::F32, {}, {}); }, "1 to 4 dims");
  expect([&] { w.add_tensor("e", DType::F32, {4, 0}, {}); }, "not positive");
  expect([&] { w.add_tensor("f", static_cast<DType>(99), {4}, std::vector<uint8_t>(4)); },
         "unknown tensor type");
  expect([&] { w.add_tensor_rows("g", DType::F32, {4}, nullptr); }, "no row source");
}

TEST_F(GgufWriterTest, UnwritablePathIsAnIoErrorNamingIt) {
  GgufWriter w;
  w.set_uint32("x", 1);
  const std::string bad = path("no-such-dir/model.gguf");
  try {
    w.write(bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::io);
    EXPECT_NE(std::string(e.what()).find("no-such-dir/model.gguf"), std::string::npos) << e.what();
  }
}

TEST_F(GgufWriterTest, FailingRowSourceLeavesNoFileBehind) {
  GgufWriter w;
  w.add_tensor_rows("t", DType::F32, {4, 4}, [](int64_t, int64_t, uint8_t*) {
    throw Error(Errc::internal, "generator failed");
  });
  EXPECT_THROW(w.write(path("partial.gguf")), Error);
  EXPECT_FALSE(std::filesystem::exists(path("partial.gguf")));
  EXPECT_FALSE(std::filesystem::exists(path("partial.gguf.tmp")));
}

}  // namespace
}  // namespace duet
