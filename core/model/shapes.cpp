#include "core/model/shapes.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/base/error.h"
#include "core/base/thread_pool.h"
#include "core/model/gguf.h"
#include "core/model/gguf_writer.h"
#include "core/model/quant.h"
#include "core/model/quant_mix.h"

namespace duet {
namespace {

// From the models' published configs (HF config.json): vocab, hidden, layers, intermediate, heads,
// KV heads, max positions, rope theta, rms eps, tied embeddings.
// Llama 3.x rope_scaling: 3.1 factor 8, 3.2 factor 32 (low 1, high 4, original context 8192).
const std::vector<ModelShape>& all_shapes() {
  constexpr Llama3RopeScaling kLlama31{8.0f, 1.0f, 4.0f, 8192};
  constexpr Llama3RopeScaling kLlama32{32.0f, 1.0f, 4.0f, 8192};
  static const std::vector<ModelShape> shapes{{
      {"llama3.2-1b", 128256, 2048, 16, 8192, 32, 8, 131072, 500000.0f, 1e-5f, true, kLlama32},
      {"llama3.2-3b", 128256, 3072, 28, 8192, 24, 8, 131072, 500000.0f, 1e-5f, true, kLlama32},
      {"llama3-8b", 128256, 4096, 32, 14336, 32, 8, 8192, 500000.0f, 1e-5f, false, {}},
      {"llama3.1-8b", 128256, 4096, 32, 14336, 32, 8, 131072, 500000.0f, 1e-5f, false, kLlama31},
      {"llama2-7b", 32000, 4096, 32, 11008, 32, 32, 4096, 10000.0f, 1e-5f, false, {}},
      {"internlm-1.8b", 92544, 2048, 24, 8192, 16, 8, 32768, 1000000.0f, 1e-5f, false, {}},
      // Gemma 2B (Transformer-Lite's model): multi-query (one KV head), head_dim 2048 / 8 = 256.
      {"gemma-2b", 256000, 2048, 18, 16384, 8, 1, 8192, 10000.0f, 1e-6f, true, {}},
      {"tiny-fortune", 2048, 256, 6, 704, 8, 4, 512, 10000.0f, 1e-5f, false, {}},
      // Test shapes: the families' vocabularies and rope settings (Llama 3.2, Qwen2.5-0.5B,
      // InternLM2) on two small layers of head_dim 32.
      {"tiny-llama3", 128256, 128, 2, 256, 4, 2, 131072, 500000.0f, 1e-5f, true, kLlama32},
      {"tiny-qwen2", 151936, 128, 2, 256, 4, 2, 32768, 1000000.0f, 1e-6f, true, {}},
      {"tiny-internlm2", 92544, 128, 2, 256, 4, 2, 32768, 1000000.0f, 1e-5f, false, {}},
      // Gemma 2B's head_dim 256 and single KV head on two small layers (2 query heads).
      {"tiny-gemma", 256000, 512, 2, 1024, 2, 1, 8192, 10000.0f, 1e-6f, true, {}},
      // Llama 3.2's family with every matrix row a whole number of K-quant super-blocks (256):
      // the K types of a _M mix without llama.cpp's fallback to Q5_0/Q8_0 (head_dim 64).
      {"tiny-llama3-256", 128256, 256, 2, 512, 4, 2, 131072, 500000.0f, 1e-5f, true, kLlama32},
  }};
  return shapes;
}

// GGUF token types (llama_token_type).
constexpr int32_t kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeByte = 6;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Fills a row with approximately normal values (Irwin-Hall of four 16-bit uniforms: mean 0, the
// given std, bounded at +-2*sqrt(3)*std), one 64-bit PRNG step per value. Seeded per row so that
// any split of rows across threads produces the same tensor.
void fill_row_normalish(uint64_t row_seed, float stddev, float* out, int64_t n) {
  const uint64_t state = splitmix64(row_seed);
  const float scale = stddev * std::sqrt(3.0f) / 65536.0f;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t z = splitmix64(state + static_cast<uint64_t>(i));
    const uint32_t sum = static_cast<uint32_t>(z & 0xffff) +
                         static_cast<uint32_t>((z >> 16) & 0xffff) +
                         static_cast<uint32_t>((z >> 32) & 0xffff) + static_cast<uint32_t>(z >> 48);
    out[i] = (static_cast<float>(sum) - 2.0f * 65535.0f) * scale;
  }
}

void check_shape(const ModelShape& s, const SyntheticModelOptions& o, int n_vocab, int n_layer,
                 int n_ctx, bool synthetic_vocab) {
  auto bad = [&](const std::string& what) {
    throw Error(Errc::invalid_argument, "mkmodel " + s.name + ": " + what);
  };
  if (s.n_embd <= 0 || s.n_ff <= 0 || s.n_head <= 0 || s.n_head_kv <= 0)
    bad("dims must be positive");
  if (s.n_embd % s.n_head != 0) bad("n_embd is not a multiple of n_head");
  if (s.n_head % s.n_head_kv != 0) bad("n_head is not a multiple of n_head_kv");
  if (synthetic_vocab && (n_vocab < kMinSyntheticVocab || n_vocab > kMaxSyntheticVocab)) {
    bad("vocab must be " + std::to_string(kMinSyntheticVocab) + " to " +
        std::to_string(kMaxSyntheticVocab));
  }
  if (n_vocab < 1 || n_vocab > kMaxSyntheticVocab)
    bad("the vocab file has " + std::to_string(n_vocab) + " tokens");
  if (s.rope_scaling.factor > 0 && o.arch != Arch::llama)
    bad("llama3 rope scaling (rope_freqs.weight) is read only by --arch llama");
  if (n_layer < 1) bad("at least one layer is needed");
  if (n_ctx < 1) bad("context must be positive");
  if (o.n_threads < 1) bad("threads must be positive");
  if (!(o.rope_scale_linear >= 0.0f) || !std::isfinite(o.rope_scale_linear))
    bad("linear rope scale must be positive (or 0: none)");
  if (!(o.weight_std > 0.0f) || !std::isfinite(o.weight_std))
    bad("weight std must be positive and finite");
  if (o.preset.empty() && o.type != DType::F32 && o.type != DType::F16 && o.type != DType::Q8_0 &&
      o.type != DType::Q4_0) {
    bad("unsupported type");
  }
  // A preset falls back per tensor (core/model/quant_mix.h) but needs whole 32-blocks at least.
  const int64_t block = o.preset.empty() ? dtype_block_elems(o.type) : kQK;
  if (s.n_embd % block != 0 || s.n_ff % block != 0) {
    bad("n_embd and n_ff must be multiples of " + std::to_string(block) + " for " +
        (o.preset.empty() ? std::string(dtype_name(o.type)) : o.preset));
  }
}

}  // namespace

const ModelShape& model_shape(std::string_view name) {
  for (const auto& s : all_shapes()) {
    if (s.name == name) return s;
  }
  std::string known;
  for (const auto& s : all_shapes()) known += (known.empty() ? "" : ", ") + s.name;
  throw Error(Errc::not_found,
              "unknown model shape '" + std::string(name) + "' (known: " + known + ")");
}

std::vector<std::string> model_shape_names() {
  std::vector<std::string> names;
  for (const auto& s : all_shapes()) names.push_back(s.name);
  return names;
}

SyntheticVocab make_synthetic_vocab(int n_vocab) {
  if (n_vocab < kMinSyntheticVocab || n_vocab > kMaxSyntheticVocab) {
    throw Error(Errc::invalid_argument,
                "synthetic vocab: needs " + std::to_string(kMinSyntheticVocab) + " to " +
                    std::to_string(kMaxSyntheticVocab) + " pieces, got " + std::to_string(n_vocab));
  }
  SyntheticVocab v;
  const size_t n = static_cast<size_t>(n_vocab);
  v.tokens.reserve(n);
  auto add = [&](std::string piece, float score, int32_t type) {
    v.tokens.push_back(std::move(piece));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0.0f, kTypeUnknown);
  add("<s>", 0.0f, kTypeControl);
  add("</s>", 0.0f, kTypeControl);
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    add(hex, 0.0f, kTypeByte);
  }
  // Normal pieces by decreasing score. Every multi-character piece is the concatenation of an
  // earlier piece and a single character, so BPE can reach it by merges.
  float score = 0.0f;
  auto add_normal = [&](std::string piece) {
    if (v.tokens.size() < n) add(std::move(piece), score--, kTypeNormal);
  };
  add_normal("\xe2\x96\x81");
  for (char c = '!'; c <= '~'; ++c) add_normal(std::string(1, c));
  std::vector<std::string> words = {""};
  while (v.tokens.size() < n) {
    std::vector<std::string> longer;
    longer.reserve(words.size() * 26);
    for (const auto& w : words) {
      for (char c = 'a'; c <= 'z'; ++c) longer.push_back(w + c);
    }
    for (const auto& w : longer) add_normal("\xe2\x96\x81" + w);
    if (longer.front().size() >= 2) {
      for (const auto& w : longer) add_normal(w);
    }
    words = std::move(longer);
  }
  return v;
}

std::vector<float> llama3_rope_freqs(const Llama3RopeScaling& s, float freq_base, int head_dim) {
  if (!(s.factor > 0) || !(s.high_freq_factor > s.low_freq_factor) || s.original_ctx <= 0 ||
      head_dim <= 0 || head_dim % 2 != 0 || !(freq_base > 0)) {
    throw Error(Errc::invalid_argument, "llama3 rope scaling: bad parameters");
  }
  constexpr double kPi = 3.14159265358979323846;
  const double low_freq_wavelen = s.original_ctx / static_cast<double>(s.low_freq_factor);
  const double high_freq_wavelen = s.original_ctx / static_cast<double>(s.high_freq_factor);
  std::vector<float> factors(static_cast<size_t>(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) {
    // The converters compute the inverse frequencies in float32.
    const float freq =
        1.0f / std::pow(freq_base, static_cast<float>(2 * i) / static_cast<float>(head_dim));
    const double wavelen = 2 * kPi / freq;
    double f;
    if (wavelen < high_freq_wavelen) {
      f = 1.0;
    } else if (wavelen > low_freq_wavelen) {
      f = s.factor;
    } else {
      const double smooth =
          (s.original_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = 1.0 / ((1.0 - smooth) / s.factor + smooth);
    }
    factors[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return factors;
}

namespace {

// Copies every tokenizer.* key of a GGUF (vocabulary, merges, special ids, chat template) into w;
// returns its token count.
int copy_tokenizer(const std::string& vocab_path, GgufWriter& w) {
  const auto vocab = GgufFile::open(vocab_path);
  if (!vocab->has("tokenizer.ggml.tokens"))
    throw Error(Errc::bad_format, vocab_path + ": no tokenizer.ggml.tokens to copy");
  for (const std::string& key : vocab->keys()) {
    if (key.rfind("tokenizer.", 0) == 0) w.set_value(key, vocab->value(key));
  }
  const uint64_t n = vocab->value("tokenizer.ggml.tokens").count;
  if (n == 0 || n > static_cast<uint64_t>(kMaxSyntheticVocab))
    throw Error(Errc::bad_format, vocab_path + ": " + std::to_string(n) + " tokens");
  return static_cast<int>(n);
}

void write_synthetic_vocab(int n_vocab, GgufWriter& w) {
  SyntheticVocab vocab = make_synthetic_vocab(n_vocab);
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", std::move(vocab.tokens));
  w.set_float32_array("tokenizer.ggml.scores", std::move(vocab.scores));
  w.set_int32_array("tokenizer.ggml.token_type", std::move(vocab.types));
  w.set_uint32("tokenizer.ggml.bos_token_id", 1);
  w.set_uint32("tokenizer.ggml.eos_token_id", 2);
  w.set_uint32("tokenizer.ggml.unknown_token_id", 0);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> bytes(v.size() * sizeof(float));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

}  // namespace

void write_synthetic_model(const ModelShape& shape, const SyntheticModelOptions& options,
                           const std::string& path) {
  if (options.n_vocab < 0 || options.n_layer < 0 || options.n_ctx < 0) {
    throw Error(Errc::invalid_argument, "mkmodel: vocab, layers and ctx must not be negative");
  }
  const bool synthetic_vocab = options.vocab_gguf.empty();
  if (!synthetic_vocab && options.n_vocab != 0) {
    throw Error(Errc::invalid_argument,
                "mkmodel: a vocab file sets the vocab size; give a size or a file, not both");
  }
  // Without a preset every matrix is options.type (file type: the pure preset of that name).
  const QuantPreset preset = options.preset.empty()
                                 ? pure(quant_preset(std::string(dtype_name(options.type))))
                             : options.preset_rules ? quant_preset(options.preset)
                                                    : pure(quant_preset(options.preset));
  GgufWriter w;
  const std::string arch(arch_name(options.arch));
  w.set_string("general.architecture", arch);
  w.set_string("general.name", "synthetic-" + shape.name + "-" +
                                   (options.preset.empty() ? std::string(dtype_name(options.type))
                                                           : std::string(preset.name)));
  w.set_uint32("general.file_type", preset.file_type);
  w.set_uint32("general.quantization_version", 2);
  w.set_uint64("duet.synthetic.seed", options.seed);
  const int n_vocab = synthetic_vocab
                          ? (options.n_vocab > 0 ? options.n_vocab
                                                 : std::min(kDefaultSyntheticVocab, shape.n_vocab))
                          : copy_tokenizer(options.vocab_gguf, w);
  const int n_layer = options.n_layer > 0 ? options.n_layer : shape.n_layer;
  const int n_ctx = options.n_ctx > 0 ? options.n_ctx : std::min(kMaxSyntheticCtx, shape.n_ctx);
  check_shape(shape, options, n_vocab, n_layer, n_ctx, synthetic_vocab);
  const int head_dim = shape.n_embd / shape.n_head;
  const int n_embd_kv = head_dim * shape.n_head_kv;

  const std::string a = arch + ".";
  w.set_uint32(a + "vocab_size", static_cast<uint32_t>(n_vocab));
  w.set_uint32(a + "context_length", static_cast<uint32_t>(n_ctx));
  w.set_uint32(a + "embedding_length", static_cast<uint32_t>(shape.n_embd));
  w.set_uint32(a + "block_count", static_cast<uint32_t>(n_layer));
  w.set_uint32(a + "feed_forward_length", static_cast<uint32_t>(shape.n_ff));
  w.set_uint32(a + "rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.set_uint32(a + "attention.head_count", static_cast<uint32_t>(shape.n_head));
  w.set_uint32(a + "attention.head_count_kv", static_cast<uint32_t>(shape.n_head_kv));
  if (options.arch == Arch::gemma) {  // as Gemma's converter writes them (head_dim)
    w.set_uint32(a + "attention.key_length", static_cast<uint32_t>(head_dim));
    w.set_uint32(a + "attention.value_length", static_cast<uint32_t>(head_dim));
  }
  w.set_float32(a + "attention.layer_norm_rms_epsilon", shape.rms_eps);
  w.set_float32(a + "rope.freq_base", shape.rope_freq_base);
  if (options.rope_scale_linear > 0) {
    w.set_string(a + "rope.scaling.type", "linear");
    w.set_float32(a + "rope.scaling.factor", options.rope_scale_linear);
  }
  if (synthetic_vocab) write_synthetic_vocab(n_vocab, w);

  // The pool lives until write() returns: the row sources below run inside it.
  ThreadPool pool(options.n_threads);
  uint64_t tensor_index = 0;
  // Two passes over the same tensor list: the first only records names and shapes, so the
  // preset's rules (which count attn_v/ffn_down tensors and look for output.weight) can pick
  // each matrix's type before the second pass adds it.
  bool planning = true;
  std::vector<TensorDesc> plan;
  std::vector<DType> types;
  size_t matrix_at = 0;
  auto add_matrix = [&](std::string name, int64_t n_in, int64_t n_out) {
    if (planning) {
      plan.push_back({std::move(name), {n_in, n_out}, DType::F32});
      return;
    }
    const uint64_t tensor_seed = splitmix64(options.seed ^ splitmix64(++tensor_index));
    const DType type = types.at(matrix_at++);
    const float stddev = options.weight_std;
    const size_t row_bytes = dtype_row_bytes(type, n_in);
    w.add_tensor_rows(std::move(name), type, {n_in, n_out},
                      [&pool, tensor_seed, type, stddev, row_bytes, n_in](
                          int64_t row0, int64_t n_rows, uint8_t* dst) {
                        pool.parallel_for(n_rows, 16, [&](int64_t begin, int64_t end) {
                          std::vector<float> row(static_cast<size_t>(n_in));
                          for (int64_t r = begin; r < end; ++r) {
                            fill_row_normalish(tensor_seed + static_cast<uint64_t>(row0 + r),
                                               stddev, row.data(), n_in);
                            quantize_row(type, row.data(), dst + static_cast<size_t>(r) * row_bytes,
                                         n_in);
                          }
                        });
                      });
  };
  auto add_norm = [&](std::string name) {
    if (planning) return;
    w.add_tensor(std::move(name), DType::F32, {shape.n_embd},
                 f32_bytes(std::vector<float>(static_cast<size_t>(shape.n_embd), 1.0f)));
  };
  // Biases are large next to a projection's output (Qwen2's are), so a forward pass that drops
  // or misplaces one is visibly wrong.
  auto add_bias = [&](std::string name, int64_t n) {
    if (planning) return;
    std::vector<float> bias(static_cast<size_t>(n));
    fill_row_normalish(splitmix64(options.seed ^ splitmix64(++tensor_index)),
                       5.0f * options.weight_std, bias.data(), n);
    w.add_tensor(std::move(name), DType::F32, {n}, f32_bytes(bias));
  };

  auto add_all = [&] {
    if (shape.rope_scaling.factor > 0 && !planning) {
      w.add_tensor(
          "rope_freqs.weight", DType::F32, {head_dim / 2},
          f32_bytes(llama3_rope_freqs(shape.rope_scaling, shape.rope_freq_base, head_dim)));
    }
    add_matrix("token_embd.weight", shape.n_embd, n_vocab);
    for (int l = 0; l < n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      add_norm(p + "attn_norm.weight");
      add_matrix(p + "attn_q.weight", shape.n_embd, shape.n_embd);
      add_matrix(p + "attn_k.weight", shape.n_embd, n_embd_kv);
      add_matrix(p + "attn_v.weight", shape.n_embd, n_embd_kv);
      if (options.arch == Arch::qwen2) {
        add_bias(p + "attn_q.bias", shape.n_embd);
        add_bias(p + "attn_k.bias", n_embd_kv);
        add_bias(p + "attn_v.bias", n_embd_kv);
      }
      add_matrix(p + "attn_output.weight", shape.n_embd, shape.n_embd);
      add_norm(p + "ffn_norm.weight");
      add_matrix(p + "ffn_gate.weight", shape.n_embd, shape.n_ff);
      add_matrix(p + "ffn_up.weight", shape.n_embd, shape.n_ff);
      add_matrix(p + "ffn_down.weight", shape.n_ff, shape.n_embd);
    }
    add_norm("output_norm.weight");
    // InternLM2 always has its own output matrix (llama.cpp requires it); Gemma never has one.
    if ((!shape.tied_embeddings && options.arch != Arch::gemma) || options.arch == Arch::internlm2)
      add_matrix("output.weight", shape.n_embd, n_vocab);
  };
  add_all();
  types = choose_tensor_types(preset, plan);
  planning = false;
  add_all();
  w.write(path);
}

}  // namespace duet
