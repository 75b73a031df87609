// The greedy next token after each prompt (a line of comma-separated ids
// on stdin), one id a line, from llama.cpp's own CPU build: tests/test_llamacpp.sh.
// Usage: node greedy_first.mjs MODEL.gguf < prompts
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {readFileSync} from "node:fs";

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath: process.argv[2]});
const context = await model.createContext({contextSize: 1024, threads: 2});
const seq = context.getSequence();
const out = [];
for (const line of readFileSync(0, "utf8").split("\n").filter((l) => l.trim())) {
    const ids = line.split(",").map(Number);
    await seq.clearHistory();
    const input = ids.slice(0, -1).concat([[ids[ids.length - 1], {generateNext: {probabilities: true}}]]);
    const res = await seq.controlledEvaluate(input);
    let best = -1, bp = -1;
    for (const [t, p] of res[res.length - 1].next.probabilities)
        if (p > bp || (p === bp && t < best)) {
            bp = p;
            best = t;
        }
    out.push(best);
}
console.log(out.join("\n"));
await context.dispose();
await model.dispose();
process.exit(0);
