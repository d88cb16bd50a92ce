// llama.cpp (node-llama-cpp's bundled prebuilt CPU build, bench/llamacpp) at a long context: one
// prompt of PROMPT_TOKENS (the same synthetic ids as bench/stack/stack_bench.cpp), then GEN_TOKENS
// greedy tokens; prefill and decode tokens/s and this process's memory (RSS and PSS from
// /proc/self/smaps_rollup, read while the context is alive and full) as one JSON line.
// usage: node llamacpp_longctx.mjs MODEL PROMPT_TOKENS GEN_TOKENS THREADS CTX [flash]
import {readFileSync} from "node:fs";

const [modelPath, promptArg, genArg, threadsArg, ctxArg, flashArg] = process.argv.slice(2);
if (!modelPath || !promptArg || !genArg || !threadsArg || !ctxArg) {
  console.error("usage: node llamacpp_longctx.mjs MODEL PROMPT_TOKENS GEN_TOKENS THREADS CTX [flash]");
  process.exit(2);
}
// node-llama-cpp is installed in bench/llamacpp (setup.sh), not beside this file, where a bare
// import would look for it.
const entry = new URL("../llamacpp/node_modules/node-llama-cpp/dist/index.js", import.meta.url);
const {getLlama, LlamaLogLevel} = await import(entry.href);
const nPrompt = Number(promptArg), nGen = Number(genArg), threads = Number(threadsArg);
const contextSize = Number(ctxArg), flashAttention = flashArg === "flash";
const llama = await getLlama({gpu: false, logLevel: LlamaLogLevel.error, build: "never"});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const vocab = model.fileInfo.metadata.tokenizer.ggml.tokens.length;

function prompt() {  // BOS then ids cycling over the vocabulary, as stack_bench
  const ids = [model.tokens.bos];
  for (let i = 1; i < nPrompt; ++i) ids.push(3 + (i * 37) % Math.max(1, vocab - 3));
  return ids;
}
function memory() {  // kB fields of smaps_rollup -> bytes
  const text = readFileSync("/proc/self/smaps_rollup", "utf8");
  const kb = (name) => Number((text.match(new RegExp(`^${name}:\\s+(\\d+) kB`, "m")) || [0, 0])[1]);
  return {rss_bytes: kb("Rss") * 1024, pss_bytes: kb("Pss") * 1024};
}

{  // warm-up: load the CPU backend's code paths once
  const context = await model.createContext({contextSize: 512, threads, batchSize: 512, flashAttention});
  await context.getSequence().evaluateWithoutGeneratingNewTokens(prompt().slice(0, 8));
  await context.dispose();
}
const context = await model.createContext({contextSize, threads, batchSize: 512, flashAttention});
const seq = context.getSequence();
const ids = prompt();
const t0 = performance.now();
await seq.evaluateWithoutGeneratingNewTokens(ids.slice(0, -1));
let generated = 0, tFirst = 0;
// The last prompt token is evaluated with sampling: its step ends the prefill (TTFT).
for await (const tok of seq.evaluate([ids[ids.length - 1]], {temperature: 0})) {
  void tok;
  if (generated === 0) tFirst = performance.now();
  if (++generated >= nGen) break;
}
const t2 = performance.now();
const mem = memory();
await context.dispose();
const ttft = tFirst - t0, tpot = generated > 1 ? (t2 - tFirst) / (generated - 1) : 0;
console.log(JSON.stringify({mode: "llama.cpp", threads, model: modelPath, context_size: contextSize,
                            flash_attention: flashAttention, prompt_tokens: nPrompt,
                            generated_tokens: generated, ttft_ms: ttft, tpot_ms: tpot,
                            prefill_tok_s: nPrompt * 1000 / ttft,
                            decode_tok_s: tpot > 0 ? 1000 / tpot : 0, ...mem}));
process.exit(0);
