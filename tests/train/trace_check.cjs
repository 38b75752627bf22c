// Reads a merged quintet timeline with an independent Trace Event parser (npm
// @tracerbench/trace-model: processes, threads and their names from the metadata events, events
// stably sorted, parents from containment) and prints what test_timeline.cpp asserts, as JSON:
//   processes: [{rank, name, threads: [names]}]  (a rank's pid is rank + 1)
//   nesting_violations: events that overlap a sibling instead of nesting (per thread)
//   order_violations:   events of a thread whose ts is below the previous one in the file
//   steps: [{rank, step, dur, compute, waits}]  (microseconds) per rank and traced step: the step
//          event, its outermost compute events less the waits inside them, and every wait
//          (communication and data events) inside the step
//   schedule: {rank: ["F0", "B0", ...]} the compute events of each rank's first traced step
// usage: node trace_check.cjs NODE_MODULES TRACE.json
'use strict';
const path = require('path');
const fs = require('fs');
const { buildModel } = require(path.join(process.argv[2], '@tracerbench/trace-model'));

const trace = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
const model = buildModel(trace);
const EPS = 0.002;  // microseconds: the file's resolution is 0.001
const WAIT_TRACKS = new Set(['data', 'tp', 'cp', 'ep', 'pp', 'dp', 'zero', 'world', 'checkpoint']);

const out = { processes: [], nesting_violations: 0, order_violations: 0, steps: [], schedule: {} };
for (const p of model.processes) {
  const rank = p.id - 1;
  out.processes.push({ rank, name: p.name, threads: p.threads.map((t) => t.name) });
  const byThread = {};
  for (const t of p.threads) {
    const events = t.events.filter((e) => e.isComplete());
    byThread[t.name] = events;
    const stack = [];
    for (const e of events) {
      while (stack.length && stack[stack.length - 1].end <= e.start + EPS) stack.pop();
      if (stack.length && e.end > stack[stack.length - 1].end + EPS) {
        out.nesting_violations++;
        if (out.nesting_violations < 5) console.error('not nested:', p.name, t.name, e.name, e.start, e.end);
      }
      stack.push(e);
    }
  }
  const steps = (byThread.step || []).filter((e) => e.name === 'step');
  const compute = byThread.compute || [];
  for (const s of steps) {
    const inside = (e) => e.start >= s.start - EPS && e.end <= s.end + EPS;
    let own = 0, last = -Infinity;
    const seq = [];
    for (const e of compute) {
      if (!inside(e) || e.start < last - EPS) continue;  // nested in the previous outermost one
      last = e.end;
      own += e.duration - e.getNumberArg('wait_us', 0);
      const mb = e.getNumberArg('mb', -1);
      const code = { forward: 'F', backward: 'B', 'backward B': 'Bi', 'backward W': 'W' }[e.name];
      if (code) seq.push(code + mb);
    }
    let waits = 0;
    for (const t of p.threads)
      if (WAIT_TRACKS.has(t.name))
        for (const e of t.events) if (e.isComplete() && inside(e) && e.name !== 'checkpoint') waits += e.duration;
    const step = s.getNumberArg('step', 0);
    out.steps.push({ rank, step, dur: s.duration, compute: own, waits });
    if (!(rank in out.schedule)) out.schedule[rank] = seq;
  }
}
// The file's own order: each thread's events by ts.
const lastTs = {};
for (const e of trace.traceEvents) {
  if (e.ph !== 'X') continue;
  const key = e.pid + '/' + e.tid;
  if (key in lastTs && e.ts < lastTs[key]) out.order_violations++;
  lastTs[key] = e.ts;
}
console.log(JSON.stringify(out));
