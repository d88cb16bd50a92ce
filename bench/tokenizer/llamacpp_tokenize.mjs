// llama.cpp's tokenizer throughput on the same text and vocab as tokenizer_bench: the whole text
// through node-llama-cpp's model.tokenize(text) (llama_tokenize, no special parsing, no BOS) on a
// model loaded with vocabOnly, best of REPEAT runs after one warm-up, printed as JSON.
// usage: node llamacpp_tokenize.mjs MODEL TEXT_FILE [REPEAT]
// node-llama-cpp comes from bench/llamacpp/node_modules (bench/llamacpp/setup.sh).
import {readFileSync} from "node:fs";

const [modelPath, textPath, repeatArg] = process.argv.slice(2);
if (!modelPath || !textPath) {
  console.error("usage: node llamacpp_tokenize.mjs MODEL TEXT_FILE [REPEAT]");
  process.exit(2);
}
const entry = new URL("../llamacpp/node_modules/node-llama-cpp/dist/index.js", import.meta.url);
const {getLlama, LlamaLogLevel} = await import(entry.href);
const repeat = Number(repeatArg || 5);
const text = readFileSync(textPath, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
const llama = await getLlama({gpu: false, logLevel: LlamaLogLevel.error, build: "never"});
const t0 = performance.now();
const model = await llama.loadModel({modelPath, vocabOnly: true, gpuLayers: 0});
const loadS = (performance.now() - t0) / 1000;

// Warm-up, and the ids' FNV-1a hash as tokenizer_bench computes it (same ids: same hash).
const ids = model.tokenize(text, false);
let tokens = ids.length;
let hash = 2166136261;
for (const id of ids) hash = Math.imul((hash ^ id) >>> 0, 16777619) >>> 0;
let best = Infinity;
for (let i = 0; i < repeat; ++i) {
  const start = performance.now();
  tokens = model.tokenize(text, false).length;
  best = Math.min(best, (performance.now() - start) / 1000);
}
console.log(JSON.stringify({impl: "llama.cpp (node-llama-cpp)", model: modelPath, bytes, tokens,
                            ids_fnv1a: hash,
                            best_s: best, mb_per_s: bytes / 1e6 / best, load_s: loadS, repeat}));
await model.dispose();
