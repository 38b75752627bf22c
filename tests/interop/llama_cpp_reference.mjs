// Runs a GGUF file in llama.cpp's own runtime (the npm package node-llama-cpp, its prebuilt CPU
// build) for tests/interop/test_llama_cpp.cpp. Usage:
//   node llama_cpp_reference.mjs NODE_MODULES JOB.json OUT_DIR
// JOB.json: {"gguf": FILE, "vocab": V, "context": N, "texts": [TEXT...], "ids": [ID...], "greedy": K}
// (without "ids", the texts are only tokenized: tokens.txt is all that is written)
// Writes OUT_DIR/tokens.txt (llama.cpp's tokenization of each text, one line each: space-separated
// ids), OUT_DIR/probs.f32 (float32 [ids.length, vocabulary]: the next-token probabilities after
// each id, softmax at temperature 1 of the logits) and OUT_DIR/greedy.txt (the K tokens that
// follow `ids` when the most probable one is taken each time). F32 KV cache, flash attention
// off, one sequence: the setting in which llama.cpp's arithmetic is closest to plain float32.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, jobFile, outDir] = process.argv.slice(2);
const job = JSON.parse(fs.readFileSync(jobFile, "utf8"));
const { getLlama, LlamaLogLevel } = await import(
    pathToFileURL(path.join(nodeModules, "node-llama-cpp/dist/index.js")).href);

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: job.gguf, gpuLayers: 0 });
const V = job.vocab;  // the GGUF's vocabulary size (its token list)

fs.writeFileSync(path.join(outDir, "tokens.txt"),
                 job.texts.map((t) => model.tokenize(t, false).join(" ") + "\n").join(""));

if (!job.ids) {
    await model.dispose();
    console.log(`llama.cpp: ${job.texts.length} texts tokenized`);
    process.exit(0);
}

const context = await model.createContext({
    contextSize: job.context, batchSize: job.context, sequences: 1, flashAttention: false, threads: 1,
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
});
const seq = context.getSequence();
const sampling = { temperature: 1, topK: 0, topP: 1, minP: 0 };

// The probabilities after every id of `ids`, as one float32 array [ids.length, V].
async function probabilities(ids) {
    const input = ids.map((t) => [t, { generateNext: { probabilities: true, options: sampling } }]);
    const out = await seq.controlledEvaluate(input);
    const all = new Float32Array(ids.length * V);
    for (let i = 0; i < ids.length; ++i)
        for (const [tok, p] of out[i].next.probabilities) all[i * V + tok] = p;
    return all;
}

const probs = await probabilities(job.ids);
fs.writeFileSync(path.join(outDir, "probs.f32"), Buffer.from(probs.buffer));

// Greedy: the most probable token after the prompt, then after each token taken.
const greedy = [];
let last = probs.subarray((job.ids.length - 1) * V, job.ids.length * V);
for (let n = 0; n < job.greedy; ++n) {
    let best = 0;
    for (let t = 1; t < V; ++t) if (last[t] > last[best]) best = t;
    greedy.push(best);
    if (n + 1 < job.greedy) last = await probabilities([best]);
}
fs.writeFileSync(path.join(outDir, "greedy.txt"), greedy.join(" ") + "\n");
await context.dispose();
await model.dispose();
console.log(`llama.cpp: vocabulary ${V}, ${job.ids.length} positions, ${greedy.length} greedy tokens`);
