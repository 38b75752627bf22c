// The llama.cpp side of scripts/bench_generate.sh: one GGUF, one prompt, greedy decoding, in
// llama.cpp's own runtime (node-llama-cpp's prebuilt CPU build), with its default settings (F16 KV
// cache, flash attention as it chooses) and THREADS threads:
//   node bench_generate_llama_cpp.mjs NODE_MODULES MODEL.gguf "ID ID ..." NEW THREADS
// prints "pp_tok_s=<prompt tokens/s> tg_tok_s=<new tokens/s>": the prompt is evaluated in one batch
// (until the first new token is out), then NEW - 1 more tokens are generated one by one.
import path from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, gguf, idsText, newText, threadsText] = process.argv.slice(2);
const ids = idsText.trim().split(/\s+/).map(Number);
const NEW = Number(newText), threads = Number(threadsText);
const { getLlama, LlamaLogLevel } = await import(
    pathToFileURL(path.join(nodeModules, "node-llama-cpp/dist/index.js")).href);
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: gguf, gpuLayers: 0 });
const context = await model.createContext({
    contextSize: ids.length + NEW + 16, batchSize: ids.length, sequences: 1, threads,
});
const seq = context.getSequence();
const t0 = performance.now();
let first = 0, n = 0;
for await (const token of seq.evaluate(ids, { temperature: 0 })) {
    if (++n === 1) first = performance.now();
    if (n === NEW) break;
}
const t1 = performance.now();
console.log(`pp_tok_s=${(ids.length / ((first - t0) / 1000)).toFixed(2)} ` +
            `tg_tok_s=${((NEW - 1) / ((t1 - first) / 1000)).toFixed(2)}`);
await context.dispose();
await model.dispose();
