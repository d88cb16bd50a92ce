// llama.cpp (node-llama-cpp's bundled prebuilt CPU build) on a GGUF: prefill and decode tokens/s
// with the same synthetic prompt ids as bench/stack/stack_bench.cpp, printed as JSON.
// usage: node llamacpp_bench.mjs MODEL PROMPT_TOKENS GEN_TOKENS THREADS [CTX]
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, promptArg, genArg, threadsArg, ctxArg] = process.argv.slice(2);
if (!modelPath || !promptArg || !genArg || !threadsArg) {
  console.error("usage: node llamacpp_bench.mjs MODEL PROMPT_TOKENS GEN_TOKENS THREADS [CTX]");
  process.exit(2);
}
const nPrompt = Number(promptArg), nGen = Number(genArg), threads = Number(threadsArg);
const llama = await getLlama({gpu: false, logLevel: LlamaLogLevel.error, build: "never"});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const contextSize = Number(ctxArg || 512);

function prompt(vocab) {  // BOS then ids cycling over the vocabulary, as stack_bench
  const ids = [model.tokens.bos];
  for (let i = 1; i < nPrompt; ++i) ids.push(3 + (i * 37) % Math.max(1, vocab - 3));
  return ids;
}
const vocab = model.fileInfo.metadata.tokenizer.ggml.tokens.length;

async function once() {
  const context = await model.createContext({contextSize, threads, batchSize: 512});
  const seq = context.getSequence();
  const ids = prompt(vocab);
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
  await context.dispose();
  const ttft = tFirst - t0, tpot = generated > 1 ? (t2 - tFirst) / (generated - 1) : 0;
  return {prompt_tokens: nPrompt, generated_tokens: generated, ttft_ms: ttft, tpot_ms: tpot,
          prefill_tok_s: nPrompt * 1000 / ttft, decode_tok_s: tpot > 0 ? 1000 / tpot : 0};
}
{  // warm-up: load the CPU backend's code paths once
  const context = await model.createContext({contextSize, threads, batchSize: 512});
  await context.getSequence().evaluateWithoutGeneratingNewTokens(prompt(vocab).slice(0, 8));
  await context.dispose();
}
const r = await once();
console.log(JSON.stringify({mode: "llama.cpp", threads, model: modelPath, ...r}));
process.exit(0);
