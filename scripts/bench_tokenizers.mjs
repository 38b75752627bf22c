// Helper of scripts/bench_tokenizers.sh, run by Node with the npm package `tiktoken`:
//   node bench_tokenizers.mjs NODE_MODULES ranks OUT_DIR        writes NAME.tiktoken for cl100k_base,
//                                                               o200k_base, gpt2 (from the package)
//   node bench_tokenizers.mjs NODE_MODULES time NAME TEXT        one timed encode_ordinary of TEXT
//                                                               after one untimed (WASM warm-up)
// `time` prints "MB/s=<rate> tokens=<n>" on its last line.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const [nodeModules, mode, a, b] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(nodeModules), "noop.js"));
const tiktoken = require("tiktoken");

if (mode === "ranks") {
  for (const name of ["cl100k_base", "o200k_base", "gpt2"]) {
    const enc = JSON.parse(fs.readFileSync(path.join(nodeModules, "tiktoken", "encoders", `${name}.json`), "utf8"));
    const out = [];
    for (const line of enc.bpe_ranks.split("\n")) {
      if (!line) continue;
      const parts = line.split(" ");
      const offset = Number(parts[1]);
      parts.slice(2).forEach((t, i) => out.push(`${t} ${offset + i}`));
    }
    fs.writeFileSync(path.join(a, `${name}.tiktoken`), out.join("\n") + "\n");
  }
} else if (mode === "time") {
  const enc = tiktoken.get_encoding(a);
  const text = fs.readFileSync(b, "utf8");
  const bytes = Buffer.byteLength(text);
  enc.encode_ordinary(text);
  const t0 = process.hrtime.bigint();
  const ids = enc.encode_ordinary(text);
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(`MB/s=${(bytes / 1e6 / s).toFixed(3)} tokens=${ids.length}`);
} else {
  throw new Error(`unknown mode ${mode}`);
}
