// llama.cpp (node-llama-cpp's bundled CPU build) as the oracle for duet's test data.
// Test-data generation only: CI reads the JSON this writes and never runs npm. See README.md.
//
//   node oracle.mjs tokenize --model F.gguf --corpus corpus.json --out O.json
//   node oracle.mjs logits   --model F.gguf --ids 1,2,3 | --ids-file ids.json --out O.json [--top 64]
//                            [--keep-last N]
//   node oracle.mjs greedy   --model F.gguf --prompt-ids 1,2,3 --n 16 --out O.json
//   node oracle.mjs chat     --model F.gguf --messages M.json --out O.json [--family NAME]
//   node oracle.mjs bench-tokenize --model F.gguf --text T.txt [--repeat 5]
//   node oracle.mjs load     --model F.gguf --out O.json   (does llama.cpp load it, or refuse?)
import {spawnSync} from "node:child_process";
import {createHash} from "node:crypto";
import {readFileSync, writeFileSync} from "node:fs";
import {basename, dirname, join} from "node:path";
import {fileURLToPath} from "node:url";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const here = dirname(fileURLToPath(import.meta.url));
const nlcDir = join(here, "node_modules", "node-llama-cpp");
const libDir = join(here, "node_modules", "@node-llama-cpp", "linux-x64", "bins", "linux-x64");
const THREADS = 2;  // fixed: ggml's CPU reductions are split by thread count

function parseArgs(argv) {
  const out = {_: []};
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i].startsWith("--")) out[argv[i].slice(2)] = argv[++i];
    else out._.push(argv[i]);
  }
  return out;
}

function need(args, key) {
  if (args[key] === undefined) throw new Error(`missing --${key}`);
  return args[key];
}

function parseIds(text) {
  return text.split(",").filter((s) => s.length).map((s) => {
    const v = Number(s);
    if (!Number.isInteger(v) || v < 0) throw new Error(`bad token id ${JSON.stringify(s)}`);
    return v;
  });
}

function sha256(path) {
  return createHash("sha256").update(readFileSync(path)).digest("hex");
}

function oracleInfo() {
  const pkg = JSON.parse(readFileSync(join(nlcDir, "package.json"), "utf8"));
  const info = JSON.parse(readFileSync(join(nlcDir, "llama", "llama.cpp.info.json"), "utf8"));
  return {node_llama_cpp: pkg.version, llama_cpp_release: info.tag, backend: "cpu",
          threads: THREADS};
}

function header(modelPath, model) {
  const tok = model.fileInfo.metadata.tokenizer?.ggml ?? {};
  return {oracle: oracleInfo(), model: basename(modelPath), model_sha256: sha256(modelPath),
          n_vocab: tok.tokens?.length ?? null,
          bos: model.tokens.bos, eos: model.tokens.eos, eot: model.tokens.eot,
          add_bos: model.tokens.shouldPrependBosToken,
          add_eos: model.tokens.shouldAppendEosToken};
}

function llamaC(request) {  // llama_c.py: llama.cpp's C API for what JavaScript cannot reach
  const r = spawnSync("python3", [join(here, "llama_c.py")],
                      {input: JSON.stringify(request), env: {...process.env, LLAMA_LIB_DIR: libDir},
                       maxBuffer: 1 << 30});
  if (r.status !== 0) throw new Error(`llama_c.py failed: ${r.stderr}`);
  return JSON.parse(r.stdout.toString("utf8"));
}

// llama.cpp's log lines (its errors explain a refusal), in order.
const llamaLog = [];

async function loadModel(llama, path, vocabOnly) {
  return llama.loadModel({modelPath: path, vocabOnly, gpuLayers: 0});
}

// Corpus entries are {"text": S} or {"hex": H} (bytes that are not valid UTF-8). llama.cpp gets
// text through model.tokenize(text, specialTokens) (common_tokenize, add_special = false);
// hex entries go through llama_c.py (llama_tokenize on the raw bytes). add_special is recorded
// once in the header (add_bos/add_eos, bos/eos): llama.cpp's add_special prepends BOS when
// add_bos and appends EOS when add_eos, nothing else; plain_add_special checks that rule.
async function cmdTokenize(llama, args) {
  const modelPath = need(args, "model");
  const corpus = JSON.parse(readFileSync(need(args, "corpus"), "utf8"));
  const model = await loadModel(llama, modelPath, true);
  const hexItems = corpus.strings.filter((s) => s.hex !== undefined).map((s) => s.hex);
  const hexOut = hexItems.length ? llamaC({op: "tokenize-bytes", model: modelPath,
                                           items: hexItems}).items : [];
  let h = 0;
  const results = corpus.strings.map((s) => {
    if (s.hex !== undefined) return {hex: s.hex, ...hexOut[h++]};
    return {text: s.text, plain: Array.from(model.tokenize(s.text, false)),
            special: Array.from(model.tokenize(s.text, true))};
  });
  // Cross-check the add_special rule on the first few text entries through the C API.
  const probe = corpus.strings.filter((s) => s.text !== undefined).slice(0, 8);
  const c = llamaC({op: "tokenize-bytes", model: modelPath,
                    items: probe.map((s) => Buffer.from(s.text, "utf8").toString("hex"))}).items;
  const hd = header(modelPath, model);
  probe.forEach((s, i) => {
    const want = [...(hd.add_bos ? [hd.bos] : []), ...Array.from(model.tokenize(s.text, false)),
                  ...(hd.add_eos ? [hd.eos] : [])];
    if (JSON.stringify(want) !== JSON.stringify(c[i].plain_add_special))
      throw new Error(`add_special rule does not hold for ${JSON.stringify(s.text)}`);
  });
  return {...hd, corpus_sha256: sha256(args.corpus), strings: results};
}

function logitsRecord(logitsMap, top) {
  // logitsMap: Map sorted by logit, highest first, every token of the vocabulary
  const ids = [], vals = [];
  let max = -Infinity, sum = 0, n = 0;
  for (const [id, v] of logitsMap) {
    if (n < top) { ids.push(id); vals.push(v); }
    if (n === 0) max = v;
    sum += Math.exp(v - max);
    ++n;
  }
  return {top_ids: ids, top_logits: vals, logsumexp: max + Math.log(sum), n_logits: n,
          margin: vals.length > 1 ? vals[0] - vals[1] : null};
}

async function newSequence(model) {
  const context = await model.createContext({contextSize: 512, batchSize: 512, threads: THREADS,
                                             sequences: 1, flashAttention: false});
  return {context, seq: context.getSequence()};
}

async function cmdLogits(llama, args) {
  const modelPath = need(args, "model");
  const ids = args["ids-file"] ? JSON.parse(readFileSync(args["ids-file"], "utf8"))
                               : parseIds(need(args, "ids"));
  const top = Number(args.top ?? 64);
  const model = await loadModel(llama, modelPath, false);
  const {context, seq} = await newSequence(model);
  // One batch: every position's logits from one prefill, as a prompt is evaluated.
  const keep = args["keep-last"] ? ids.length - Number(args["keep-last"]) : 0;
  const out = await seq.controlledEvaluate(
      ids.map((t, i) => (i < keep ? t : [t, {generateNext: {logits: true}}])));
  // --keep-last N: only the last N positions are written (a long sequence, so RoPE at large
  // positions is exercised, without committing every position's logits)
  const first = args["keep-last"] ? Math.max(0, ids.length - Number(args["keep-last"])) : 0;
  const positions = [];
  out.forEach((o, i) => { if (i >= first) positions.push({pos: i, ...logitsRecord(o.next.logits, top)}); });
  await context.dispose();
  return {...header(modelPath, model), ids, top, flash_attention: false, kv_cache: "f16",
          positions};
}

async function cmdGreedy(llama, args) {
  const modelPath = need(args, "model");
  const prompt = parseIds(need(args, "prompt-ids"));
  const n = Number(need(args, "n"));
  const model = await loadModel(llama, modelPath, false);
  // 1. llama.cpp's greedy sampler (temperature 0); EOS/EOT are not treated specially.
  let {context, seq} = await newSequence(model);
  const sampled = [];
  for await (const t of seq.evaluate(prompt, {temperature: 0})) {
    sampled.push(t);
    if (sampled.length >= n) break;
  }
  await context.dispose();
  // 2. The same continuation step by step with each step's top-2 logits, so a comparison can
  // tell a real divergence from a near-tie that llama.cpp's F16 rounding decides.
  ({context, seq} = await newSequence(model));
  const top2 = {generateNext: {logits: {filter: {tokens: [], includeTop: 2}}}};
  const generated = [], margins = [];
  let input = prompt.map((t, i) => (i === prompt.length - 1 ? [t, top2] : t));
  for (let i = 0; i < n; ++i) {
    const out = await seq.controlledEvaluate(input);
    const entries = [...out[out.length - 1].next.logits.entries()];
    generated.push(entries[0][0]);
    margins.push(entries[0][1] - entries[1][1]);
    input = [[entries[0][0], top2]];
  }
  await context.dispose();
  if (JSON.stringify(generated) !== JSON.stringify(sampled))
    throw new Error(`greedy sampler ${sampled} and argmax ${generated} differ`);
  return {...header(modelPath, model), prompt_ids: prompt, n, generated, margins};
}

// The formatted text comes from llama_chat_apply_template (llama.cpp's own template code, which
// recognises the template by its text) on the file's tokenizer.chat_template; the ids are
// llama.cpp's tokenization of it with special parsing and add_special, as llama-cli and
// llama-server tokenize a formatted prompt. jinja_text is the same conversation rendered by
// llama.cpp's Jinja engine (node-llama-cpp's AddonJinjaRenderer) for comparison.
async function cmdChat(llama, args) {
  const modelPath = need(args, "model");
  const messages = JSON.parse(readFileSync(need(args, "messages"), "utf8"));
  const model = await loadModel(llama, modelPath, true);
  const template = model.fileInfo.metadata.tokenizer?.chat_template;
  if (!template) throw new Error(`${modelPath} has no tokenizer.chat_template`);
  const auto = llamaC({op: "chat-template", template, messages, add_ass: true});
  if (auto.error) throw new Error(`${modelPath}: ${auto.error}`);
  // --template-name NAME: llama.cpp's template chosen by name (llama-cli --chat-template NAME),
  // for a family whose template text this llama.cpp recognises as another family
  const forced = args["template-name"];
  const r = forced ? llamaC({op: "chat-template", template: forced, messages, add_ass: true})
                   : auto;
  if (r.error) throw new Error(`${forced}: ${r.error}`);
  const hd = header(modelPath, model);
  const body = Array.from(model.tokenize(r.text, true));
  // add_special: BOS unless the template text already starts with it (llama.cpp warns about a
  // double BOS but adds it; none of the committed templates emit BOS through this path)
  const ids = [...(hd.add_bos ? [hd.bos] : []), ...body, ...(hd.add_eos ? [hd.eos] : [])];
  let jinja = null;
  try {
    const tokText = (id) => (id == null ? "" : model.detokenize([id], true));
    const renderer = new llama._bindings.AddonJinjaRenderer(template);
    jinja = renderer.render({messages, add_generation_prompt: true, bos_token: tokText(hd.bos),
                             eos_token: tokText(hd.eos)});
  } catch (e) {
    jinja = {error: String(e.message ?? e)};
  }
  return {...hd, family: args.family ?? null, chat_template: template,
          template_name: forced ?? null, messages, add_generation_prompt: true, text: r.text,
          ids, same_as_builtin: r.same_as_builtin, auto_text: auto.text,
          auto_same_as_builtin: auto.same_as_builtin, jinja_text: jinja};
}

// llama.cpp's tokenizer throughput on one text (the whole file in one llama_tokenize call, one
// thread, parse_special off), best of --repeat runs: the number duet's tokenizer bench is set
// beside. Prints {mb_per_s, bytes, tokens, seconds}.
async function cmdBenchTokenize(llama, args) {
  const modelPath = need(args, "model");
  const text = readFileSync(need(args, "text"), "utf8");
  const repeat = Number(args.repeat ?? 5);
  const model = await loadModel(llama, modelPath, true);
  const bytes = Buffer.byteLength(text, "utf8");
  let best = Infinity, tokens = 0;
  for (let i = 0; i < repeat; ++i) {
    const t0 = process.hrtime.bigint();
    tokens = model.tokenize(text, false).length;
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  return {oracle: oracleInfo(), model: basename(modelPath), text: basename(args.text), bytes,
          tokens, seconds: best, mb_per_s: bytes / 1e6 / best};
}

// Whether llama.cpp loads a file, through both of its readers: node-llama-cpp's (its JavaScript
// GGUF parser, then llama.cpp) as {"loaded": true} or {"loaded": false, "error": the message
// thrown, "log": llama.cpp's log lines}, and llama.cpp's C API alone (llama_c.py `load`:
// gguf_init and the model loader) as "llama_cpp_c": {"loaded", "log"}. For files duet writes that
// llama.cpp must refuse (E0M4, duet's own tensor type): the record, written after both, is the
// proof that the refusals were errors and not crashes (llama_c.py would record a termination).
async function cmdLoad(llama, args) {
  const modelPath = need(args, "model");
  const out = {oracle: oracleInfo(), model: basename(modelPath), model_sha256: sha256(modelPath)};
  try {
    const model = await loadModel(llama, modelPath, false);
    await model.dispose();
    out.loaded = true;
  } catch (e) {
    out.loaded = false;
    out.error = String(e?.message ?? e);
  }
  out.log = llamaLog.map((l) => l.trim()).filter((l) => l.length);
  out.llama_cpp_c = llamaC({op: "load", model: modelPath});
  return out;
}

const commands = {tokenize: cmdTokenize, logits: cmdLogits, greedy: cmdGreedy, chat: cmdChat,
                  "bench-tokenize": cmdBenchTokenize, load: cmdLoad};
const args = parseArgs(process.argv.slice(2));
const cmd = commands[args._[0]];
if (!cmd) {
  console.error("usage: node oracle.mjs tokenize|logits|greedy|chat|load --model F ... --out O");
  process.exit(2);
}
const llama = await getLlama({gpu: false, logLevel: LlamaLogLevel.error, build: "never",
                              logger: (level, message) => {
                                llamaLog.push(message);
                                process.stderr.write(message + "\n");
                              }});
const result = await cmd(llama, args);
const text = JSON.stringify(result) + "\n";
if (args.out) writeFileSync(args.out, text);
else process.stdout.write(text);
process.exit(0);
