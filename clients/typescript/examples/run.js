#!/usr/bin/env node
// A small `submit` in TypeScript's clothes, over @agentfleet/client: submit
// a run and follow it live, or follow one, steer it, print its result.
//
//   node examples/run.js "What is 6*7?"                      submit, follow, print the answer as it streams
//   node examples/run.js --request FILE "prompt"            the request from a JSON file (cmd/submit/examples)
//   node examples/run.js --detach ...                       print the run id and exit
//   node examples/run.js --follow RUN [--json]              follow a run (--json: the envelopes, as submit follow --json)
//   node examples/run.js --steer RUN "text" [--key K]       steer a run
//   node examples/run.js --result RUN                       the final answer (waits for the run)
//
// NATS_URL (default nats://127.0.0.1:4222) and the other NATS_* variables
// say where the fleet is. Exit codes as submit's: 0 succeeded, 1 failed,
// 3 aborted, 4 cannot reach NATS.
import { readFileSync } from "node:fs";
import { connect, formatEnvelope, AgentfleetError } from "../src/index.js";

const args = process.argv.slice(2);
/** @param {string} name */
const flag = (name) => {
  const i = args.indexOf(name);
  if (i < 0) return undefined;
  const v = args[i + 1];
  args.splice(i, 2);
  return v;
};
/** @param {string} name */
const bool = (name) => {
  const i = args.indexOf(name);
  if (i >= 0) args.splice(i, 1);
  return i >= 0;
};

const request = flag("--request");
const queue = flag("--queue");
const follow = flag("--follow");
const steer = flag("--steer");
const result = flag("--result");
const key = flag("--key");
const json = bool("--json");
const detach = bool("--detach");

let client;
try {
  client = await connect();
} catch (err) {
  console.error(`run.js: ${/** @type {Error} */ (err).message}`);
  process.exit(4);
}

/** Follows a run, printing its text as it streams (or the envelopes); resolves the exit code. @param {string} run */
async function followRun(run) {
  let status = "";
  let text = false; // text printed since the assistant message started
  for await (const env of client.follow(run, { includeUnknown: json })) {
    if (json) {
      process.stdout.write(formatEnvelope(env) + "\n");
      if (env.event.type === "run_finished") status = /** @type {any} */ (env.event).status;
      continue;
    }
    const ev = env.event;
    if (ev.type === "message_update" && ev.assistantMessageEvent.type === "text_delta") {
      process.stdout.write(ev.assistantMessageEvent.delta ?? "");
      text = true;
    }
    if (ev.type === "message_end" && ev.message.role === "assistant" && text) {
      process.stdout.write("\n");
      text = false;
    }
    if (ev.type === "tool_execution_start") process.stdout.write(`→ ${ev.toolName}(${JSON.stringify(ev.args ?? {})})\n`);
    if (ev.type === "tool_execution_end") process.stdout.write(`← ${JSON.stringify(ev.result.content)}${ev.isError ? " (error)" : ""}\n`);
    if (ev.type === "run_finished") {
      status = ev.status;
      process.stdout.write(`${ev.status}${ev.reason ? ` (${ev.reason})` : ""} · ${ev.turns} turn(s) · ${ev.usage.totalTokens} tokens${ev.error ? ` · ${ev.error}` : ""}\n`);
    }
  }
  return status === "succeeded" ? 0 : status === "aborted" ? 3 : 1;
}

let code = 0;
try {
  if (follow) code = await followRun(follow);
  else if (steer) {
    const { seq, duplicate } = await client.steer(steer, args.join(" "), key ? { key } : {});
    console.log(`steering sent to run ${steer} (control sequence ${seq}${duplicate ? ", a retry" : ""})`);
  } else if (result) {
    const r = await client.result(result);
    console.log(r.text);
    code = r.status === "succeeded" ? 0 : r.status === "aborted" ? 3 : 1;
  } else {
    const req = request ? JSON.parse(readFileSync(request, "utf8")) : {};
    if (args.length) req.prompt = args.join(" ");
    const { id } = await client.submit(req, queue ? { queue } : {});
    if (detach) console.log(id);
    else code = await followRun(id);
  }
} catch (err) {
  console.error(`run.js: ${/** @type {Error} */ (err).message}`);
  code = err instanceof AgentfleetError && err.code === "nats_unreachable" ? 4 : 1;
}
await client.close();
process.exit(code);
