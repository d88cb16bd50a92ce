#include "core/model/model.h"

#include <cmath>
#include <limits>
#include <set>

#include "core/base/error.h"
#include "core/model/quant.h"

namespace duet {

class LlamaLoader {
 public:
  explicit LlamaLoader(LlamaModel& m) : m_(m), f_(*m.file_) {}

  void load() {
    if (f_.tensors().empty()) {
      throw Error(Errc::invalid_argument,
                  f_.path() + " has no weights (a vocab-only GGUF): only `duet tokenize` reads it");
    }
    read_hparams();
    LlamaHparams& hp = m_.hp_;
    m_.tok_embd = matrix("token_embd.weight", hp.n_vocab, hp.n_embd);
    // llama and qwen2 tie the output projection to the embedding when output.weight is absent;
    // internlm2 always has its own; gemma never has one (llama.cpp reads token_embd for it, so
    // an output.weight in a gemma file is an unread tensor, refused below as llama.cpp does).
    m_.tied_ = hp.arch == Arch::gemma ||
               (hp.arch != Arch::internlm2 && f_.find_tensor("output.weight") == nullptr);
    m_.output = m_.tied_ ? m_.tok_embd : matrix("output.weight", hp.n_vocab, hp.n_embd);
    m_.output_norm = vec("output_norm.weight", hp.n_embd);
    if (f_.find_tensor("rope_freqs.weight")) {
      if (hp.arch != Arch::llama)
        fail(Errc::unsupported, "rope_freqs.weight is only read for llama models");
      m_.rope_freqs = vec("rope_freqs.weight", hp.head_dim / 2);
      for (int i = 0; i < hp.head_dim / 2; ++i) {
        if (!(m_.rope_freqs[i] > 0) || !std::isfinite(m_.rope_freqs[i]))
          fail(Errc::bad_format, "rope_freqs.weight[" + std::to_string(i) +
                                     "] = " + std::to_string(m_.rope_freqs[i]) +
                                     " is not a positive frequency divisor");
      }
    }
    m_.vocab_ = Vocab::from_gguf(f_);
    if (static_cast<int>(m_.vocab_.pieces.size()) != hp.n_vocab) {
      fail(Errc::bad_format, "tokenizer has " + std::to_string(m_.vocab_.pieces.size()) +
                                 " pieces but token_embd.weight has " + std::to_string(hp.n_vocab) +
                                 " rows");
    }
    const int kv_dim = hp.n_head_kv * hp.head_dim;
    const bool biases_required = hp.arch == Arch::qwen2;
    for (int i = 0; i < hp.n_layer; ++i) {
      const std::string p = "blk." + std::to_string(i) + ".";
      LlamaLayer l;
      l.attn_norm = vec(p + "attn_norm.weight", hp.n_embd);
      l.wq = matrix(p + "attn_q.weight", hp.n_embd, hp.n_embd);
      l.wk = matrix(p + "attn_k.weight", kv_dim, hp.n_embd);
      l.wv = matrix(p + "attn_v.weight", kv_dim, hp.n_embd);
      // q/k/v biases: qwen2 always has them; llama.cpp reads them when present for the others.
      if (biases_required || f_.find_tensor(p + "attn_q.bias")) {
        l.bq = vec(p + "attn_q.bias", hp.n_embd);
        l.bk = vec(p + "attn_k.bias", kv_dim);
        l.bv = vec(p + "attn_v.bias", kv_dim);
      }
      l.wo = matrix(p + "attn_output.weight", hp.n_embd, hp.n_embd);
      l.ffn_norm = vec(p + "ffn_norm.weight", hp.n_embd);
      l.w_gate = matrix(p + "ffn_gate.weight", hp.n_ff, hp.n_embd);
      l.w_up = matrix(p + "ffn_up.weight", hp.n_ff, hp.n_embd);
      l.w_down = matrix(p + "ffn_down.weight", hp.n_embd, hp.n_ff);
      m_.layers.push_back(l);
    }
    // A tensor nothing above read (an output bias, MoE experts, a fused wqkv...) would change the
    // model's function: refuse rather than run a different model, as llama.cpp does.
    for (const auto& t : f_.tensors()) {
      if (!used_.contains(t.name))
        fail(Errc::unsupported, "tensor \"" + t.name + "\" is not part of a " +
                                    std::string(arch_name(hp.arch)) + " model duet runs");
    }
  }

 private:
  [[noreturn]] void fail(Errc code, const std::string& problem) const {
    throw Error(code, f_.path() + ": " + problem);
  }

  int count(const std::string& key, uint64_t max) const {
    const uint64_t v = f_.get_uint(key);
    if (v == 0 || v > max)
      fail(Errc::bad_format,
           "hyperparameter " + key + " = " + std::to_string(v) + " is out of range");
    return static_cast<int>(v);
  }

  void read_hparams() {
    // llama.cpp requires general.architecture; older duet files without it are llama.
    const std::string arch_str =
        f_.has("general.architecture") ? f_.get_string("general.architecture") : "llama";
    LlamaHparams& hp = m_.hp_;
    try {
      hp.arch = parse_arch(arch_str);
    } catch (const Error& e) {
      fail(e.code(), e.what());
    }
    // llama.cpp's llama_model_rope_type: qwen2 and gemma pair a head's values half a head apart
    // (HF's rotate_half, which their converters keep; llama's converter permutes Q/K instead).
    hp.rope_mode = hp.arch == Arch::qwen2 || hp.arch == Arch::gemma ? ops::RopeMode::neox
                                                                    : ops::RopeMode::normal;
    const std::string a = arch_str + ".";
    constexpr uint64_t kMaxDim = 1 << 20;
    hp.n_ctx = count(a + "context_length", 1 << 24);
    hp.n_embd = count(a + "embedding_length", kMaxDim);
    hp.n_layer = count(a + "block_count", 4096);
    hp.n_ff = count(a + "feed_forward_length", kMaxDim);
    hp.n_head = count(a + "attention.head_count", 4096);
    hp.n_head_kv = f_.has(a + "attention.head_count_kv")
                       ? count(a + "attention.head_count_kv", 4096)
                       : hp.n_head;
    hp.rope_freq_base =
        f_.has(a + "rope.freq_base") ? f_.get_float(a + "rope.freq_base") : 10000.0f;
    hp.rms_eps = f_.has(a + "attention.layer_norm_rms_epsilon")
                     ? f_.get_float(a + "attention.layer_norm_rms_epsilon")
                     : 1e-5f;
    read_rope_scaling(a);
    if (hp.n_embd % hp.n_head != 0) {
      fail(Errc::bad_format, "embedding_length " + std::to_string(hp.n_embd) +
                                 " is not a multiple of head_count " + std::to_string(hp.n_head));
    }
    if (hp.n_head % hp.n_head_kv != 0) {
      fail(Errc::bad_format, "head_count " + std::to_string(hp.n_head) +
                                 " is not a multiple of head_count_kv " +
                                 std::to_string(hp.n_head_kv));
    }
    hp.head_dim = hp.n_embd / hp.n_head;
    // llama.cpp reads the head size from attention.key_length / value_length (default n_embd /
    // n_head). Gemma 2B's is n_embd / n_head (2048 / 8 = 256); Gemma 7B's (256, not 3072 / 16)
    // would need Q and O wider than n_embd, which duet does not run.
    for (const char* key : {"attention.key_length", "attention.value_length"}) {
      if (f_.has(a + key) && f_.get_uint(a + key) != static_cast<uint64_t>(hp.head_dim))
        fail(Errc::unsupported,
             a + key + " " + std::to_string(f_.get_uint(a + key)) +
                 " is not embedding_length / head_count = " + std::to_string(hp.head_dim) +
                 " (heads wider than n_embd / n_head are not supported)");
    }
    if (hp.arch == Arch::gemma) {
      hp.ffn_act = ops::FfnAct::gelu_tanh;
      hp.embd_scale = std::sqrt(static_cast<float>(hp.n_embd));  // llama.cpp: sqrtf(n_embd)
    }
    if (hp.head_dim % 2 != 0)
      fail(Errc::bad_format, "head dimension " + std::to_string(hp.head_dim) + " is odd");
    if (f_.has(a + "rope.dimension_count") &&
        f_.get_uint(a + "rope.dimension_count") != static_cast<uint64_t>(hp.head_dim)) {
      fail(Errc::unsupported,
           a + "rope.dimension_count " + std::to_string(f_.get_uint(a + "rope.dimension_count")) +
               " is not the head dimension " + std::to_string(hp.head_dim) + " (partial RoPE)");
    }
    if (!(hp.rope_freq_base > 0) || !(hp.rms_eps >= 0))
      fail(Errc::bad_format, "rope.freq_base or rms epsilon out of range");
    // The vocabulary size is the embedding table's; vocab_size, when present, must agree.
    const GgufTensorInfo& embd = f_.tensor("token_embd.weight");
    if (embd.dims.size() != 2 || embd.dims[1] <= 0 ||
        embd.dims[1] > std::numeric_limits<int>::max())
      fail(Errc::bad_format, "tensor \"token_embd.weight\" must be 2-D [n_embd, n_vocab]");
    hp.n_vocab = static_cast<int>(embd.dims[1]);
    if (f_.has(a + "vocab_size") &&
        f_.get_uint(a + "vocab_size") != static_cast<uint64_t>(hp.n_vocab)) {
      fail(Errc::bad_format, a + "vocab_size " + std::to_string(f_.get_uint(a + "vocab_size")) +
                                 " disagrees with token_embd.weight's " +
                                 std::to_string(hp.n_vocab) + " rows");
    }
  }

  // <arch>.rope.scaling.type (llama.cpp's default when absent: "linear") and
  // <arch>.rope.scaling.factor (or the older rope.scale_linear): linear scaling divides every
  // angle by the factor. Llama 3's "llama3" scaling is no metadata type: the converter writes its
  // per-frequency divisors as rope_freqs.weight.
  void read_rope_scaling(const std::string& a) {
    const std::string type =
        f_.has(a + "rope.scaling.type") ? f_.get_string(a + "rope.scaling.type") : "linear";
    float factor = 0.0f;
    if (f_.has(a + "rope.scaling.factor"))
      factor = f_.get_float(a + "rope.scaling.factor");
    else if (f_.has(a + "rope.scale_linear"))
      factor = f_.get_float(a + "rope.scale_linear");
    if (!std::isfinite(factor) || factor < 0.0f)
      fail(Errc::bad_format, "rope scaling factor " + std::to_string(factor) + " is out of range");
    if (type == "none") {
      m_.hp_.rope_freq_scale = 1.0f;
    } else if (type == "linear") {
      m_.hp_.rope_freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
    } else if (type == "yarn" || type == "longrope") {
      fail(Errc::unsupported, "rope scaling type \"" + type + "\" is not supported (none, linear)");
    } else {
      fail(Errc::bad_format,
           "unknown rope scaling type \"" + type +
               "\" (known: none, linear, yarn, longrope; llama3 scaling is the rope_freqs.weight "
               "tensor)");
    }
  }

  static std::string dims_str(const std::vector<int64_t>& d) {
    std::string s = "[";
    for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
  }

  const GgufTensorInfo& expect(const std::string& name, std::vector<int64_t> dims) const {
    const GgufTensorInfo* t = f_.find_tensor(name);
    if (!t) fail(Errc::not_found, "tensor \"" + name + "\" is missing");
    used_.insert(name);
    if (t->dims != dims) {
      fail(Errc::bad_format, "tensor \"" + name + "\" has dims " + dims_str(t->dims) +
                                 " but the hyperparameters need " + dims_str(dims));
    }
    return *t;
  }

  // Any type of core/model/dtype.h, chosen per tensor (llama.cpp's _M files mix them). Quantised
  // matrices' scales are checked here, once at load, so a NaN/Inf scale is a load error naming
  // the tensor and block instead of NaN logits later (one fp16 read per block).
  ops::Matrix matrix(const std::string& name, int64_t rows, int64_t cols) const {
    const GgufTensorInfo& t = expect(name, {cols, rows});
    const int64_t n_blocks = rows * (cols / dtype_block_elems(t.type));
    const int64_t bad = first_nonfinite_scale(t.type, t.data, n_blocks);
    if (bad >= 0) {
      const int64_t per_row = cols / dtype_block_elems(t.type);
      fail(Errc::bad_format, "tensor \"" + name + "\" (" + std::string(dtype_name(t.type)) +
                                 ") row " + std::to_string(bad / per_row) + " block " +
                                 std::to_string(bad % per_row) +
                                 " has a scale that is not finite (NaN or Inf)");
    }
    return ops::Matrix{t.type, rows, cols, t.data};
  }

  // A 1-D vector of n floats (norm weights, biases, rope factors), as fp32.
  const float* vec(const std::string& name, int n) {
    const GgufTensorInfo& t = expect(name, {n});
    if (t.type == DType::F32) return reinterpret_cast<const float*>(t.data);
    if (t.type != DType::F16 && t.type != DType::BF16) {
      fail(Errc::unsupported, "tensor \"" + name + "\" is " + std::string(dtype_name(t.type)) +
                                  "; vectors must be F32, F16 or BF16");
    }
    auto& converted = m_.converted_vectors_.emplace_back(static_cast<size_t>(n));
    dequantize_row(t.type, t.data, converted.data(), n);
    return converted.data();
  }

  LlamaModel& m_;
  const GgufFile& f_;
  mutable std::set<std::string, std::less<>> used_;  // tensor names load() has read
};

std::unique_ptr<LlamaModel> LlamaModel::load(const std::string& path) {
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  m->file_ = GgufFile::open(path);
  LlamaLoader(*m).load();
  return m;
}

uint64_t LlamaModel::offset_of(const void* p) const {
  const auto* b = static_cast<const uint8_t*>(p);
  if (b < file_->data() || b >= file_->data() + file_->size()) {
    throw Error(Errc::invalid_argument,
                file_->path() + ": pointer is not inside the mapped model file");
  }
  return static_cast<uint64_t>(b - file_->data());
}

ops::RopeParams rope_params(const LlamaModel& m) {
  return ops::RopeParams{m.hp().rope_freq_base, m.hp().rope_freq_scale, m.rope_freqs,
                         m.hp().rope_mode};
}

uint64_t LlamaModel::weight_bytes() const {
  auto mat = [](const ops::Matrix& w) { return static_cast<uint64_t>(w.rows) * w.row_bytes(); };
  const uint64_t norm = static_cast<uint64_t>(hp_.n_embd) * sizeof(float);
  uint64_t total = tok_embd.row_bytes() + mat(output) + norm;  // one embedding row per token
  for (const auto& l : layers) {
    total += mat(l.wq) + mat(l.wk) + mat(l.wv) + mat(l.wo) + mat(l.w_gate) + mat(l.w_up) +
             mat(l.w_down) + 2 * norm;
    if (l.bq) total += static_cast<uint64_t>(l.wq.rows + l.wk.rows + l.wv.rows) * sizeof(float);
  }
  return total;
}

}  // namespace duet
