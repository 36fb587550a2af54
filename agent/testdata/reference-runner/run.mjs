// Prints the conformance trace (format: ../conformance/README.md) of one
// scenario as the reference runs it: node run.mjs SCENARIO.json
import { readFileSync } from "node:fs";
import { Agent } from "@earendil-works/pi-agent-core";
import { createFauxCore } from "@earendil-works/pi-ai";

const sc = JSON.parse(readFileSync(process.argv[2], "utf8"));
const out = [];
const reps = [];
function add(line) {
	const n = out.length;
	if (n > 0 && out[n - 1] === line && line.startsWith("message_update ")) {
		reps[n - 1]++;
		return;
	}
	out.push(line);
	reps.push(1);
}

const q = (s) => JSON.stringify(s ?? "");
function canonical(v) {
	if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
	if (v !== null && typeof v === "object") {
		return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(",")}}`;
	}
	return JSON.stringify(v);
}
const blocks = (c) => (typeof c === "string" ? [{ type: "text", text: c }] : (c ?? []));
const joinText = (c) => blocks(c).filter((b) => b.type === "text").map((b) => b.text).join("");
const joinThinking = (c) => blocks(c).filter((b) => b.type === "thinking").map((b) => b.thinking).join("");
function resultText(s) {
	if (s.startsWith("Validation failed for tool")) {
		const i = s.indexOf("\n");
		if (i >= 0) return s.slice(0, i);
	}
	return s;
}
function message(raw) {
	if (typeof raw === "string") return { role: "user", content: [{ type: "text", text: raw }], timestamp: 0 };
	return { timestamp: 0, ...raw };
}

const core = createFauxCore({
	api: "faux",
	provider: "faux",
	tokenSize: { min: sc.model?.tokenSize ?? 4, max: sc.model?.tokenSize ?? 4 },
	tokensPerSecond: sc.model?.tokensPerSecond ?? 0,
});
core.setResponses(
	(sc.responses ?? []).map((r) => ({
		role: "assistant",
		content: r.content ?? [],
		stopReason: r.stopReason ?? "stop",
		...(r.errorMessage === undefined ? {} : { errorMessage: r.errorMessage }),
		timestamp: 0,
	})),
);

function sleep(ms, signal) {
	return new Promise((resolve, reject) => {
		if (signal?.aborted) return reject(new Error("Operation aborted"));
		const timer = setTimeout(() => {
			signal?.removeEventListener("abort", onAbort);
			resolve();
		}, ms);
		function onAbort() {
			clearTimeout(timer);
			reject(new Error("Operation aborted"));
		}
		signal?.addEventListener("abort", onAbort, { once: true });
	});
}

const tools = (sc.tools ?? []).map((t) => ({
	name: t.name,
	label: t.name,
	description: t.description ?? "",
	parameters: t.parameters ?? { type: "object", properties: {} },
	...(t.executionMode ? { executionMode: t.executionMode } : {}),
	async execute(_id, args, signal, onUpdate) {
		for (const u of t.updates ?? []) onUpdate?.({ content: [{ type: "text", text: u }], details: {} });
		if (t.delayMs > 0) await sleep(t.delayMs, signal);
		if (t.throws) throw new Error(t.throws);
		let text = t.result ?? "ok";
		if (t.echoArgs) text += canonical(args);
		return { content: [{ type: "text", text }], details: {}, ...(t.terminate ? { terminate: true } : {}) };
	},
}));

const hooks = sc.hooks ?? {};
let stopCalls = 0;
const agent = new Agent({
	initialState: {
		systemPrompt: sc.agent?.systemPrompt ?? "",
		model: core.models[0],
		tools,
		messages: (sc.agent?.messages ?? []).map(message),
	},
	streamFn: (model, context, options) => core.stream(model, context, options),
	toolExecution: sc.agent?.toolExecution ?? "parallel",
	steeringMode: sc.agent?.steeringMode ?? "one-at-a-time",
	followUpMode: sc.agent?.followUpMode ?? "one-at-a-time",
	...(hooks.beforeToolCall
		? {
				beforeToolCall: async ({ toolCall }) => {
					const h = hooks.beforeToolCall.find((x) => x.tool === toolCall.name);
					return h ? { block: h.block, reason: h.reason, terminate: h.terminate } : undefined;
				},
			}
		: {}),
	...(hooks.afterToolCall
		? {
				afterToolCall: async ({ toolCall }) => {
					const h = hooks.afterToolCall.find((x) => x.tool === toolCall.name);
					if (!h) return undefined;
					return {
						content: h.text === undefined ? undefined : [{ type: "text", text: h.text }],
						isError: h.isError,
						terminate: h.terminate,
					};
				},
			}
		: {}),
	...(hooks.shouldStopAfterTurn
		? { shouldStopAfterTurn: async () => ++stopCalls >= hooks.shouldStopAfterTurn.turn }
		: {}),
});

function perform(step) {
	switch (step.do) {
		case "prompt":
			return step.messages ? agent.prompt(step.messages.map(message)) : agent.prompt(step.text);
		case "continue":
			return agent.continue();
		case "steer":
			return agent.steer(message(step.text));
		case "followUp":
			return agent.followUp(message(step.text));
		case "abort":
			return agent.abort();
		case "reset":
			return agent.reset();
		case "clearQueues":
			return agent.clearAllQueues();
	}
	throw new Error(`unknown step ${step.do}`);
}
function callLine(step, err) {
	if (err === undefined) return `call ${step.do} ok`;
	const m = err instanceof Error ? err.message : String(err);
	if (m.startsWith("Agent is already processing")) return `call ${step.do} error already-running`;
	if (m === "No messages to continue from") return `call ${step.do} error no-messages`;
	if (m.startsWith("Cannot continue from message role")) return `call ${step.do} error cannot-continue`;
	return `call ${step.do} error ${q(m)}`;
}
// The listener stays synchronous unless a step returns a promise, so the
// runner adds no turns of the event loop of its own.
function run(step) {
	let r;
	try {
		r = perform(step);
	} catch (err) {
		add(callLine(step, err));
		return;
	}
	if (r instanceof Promise) {
		return r.then(
			() => add(callLine(step)),
			(err) => add(callLine(step, err)),
		);
	}
	add(callLine(step));
}

function traceLine(ev) {
	switch (ev.type) {
		case "agent_start":
		case "turn_start":
			return ev.type;
		case "agent_end":
			return `agent_end n=${ev.messages.length}`;
		case "turn_end":
			return `turn_end ${ev.message.stopReason} results=${ev.toolResults.length}`;
		case "message_update":
			return `message_update ${ev.assistantMessageEvent.type}`;
		case "message_start":
		case "message_end": {
			const m = ev.message;
			if (m.role === "assistant") {
				if (ev.type === "message_start") return "message_start assistant";
				let line = `message_end assistant ${m.stopReason} text=${q(joinText(m.content))}`;
				const th = joinThinking(m.content);
				if (th !== "") line += ` thinking=${q(th)}`;
				const calls = blocks(m.content).filter((b) => b.type === "toolCall");
				if (calls.length > 0) line += ` tools=[${calls.map((c) => `${c.name}(${c.id})`).join(",")}]`;
				if (m.errorMessage) line += ` error=${q(m.errorMessage)}`;
				return line;
			}
			if (m.role === "toolResult") {
				return `${ev.type} toolResult ${m.toolName} ${m.toolCallId} error=${m.isError} ${q(resultText(joinText(m.content)))}`;
			}
			return `${ev.type} ${m.role} ${q(joinText(m.content))}`;
		}
		case "tool_execution_start":
			return `tool_execution_start ${ev.toolCallId} ${ev.toolName} ${canonical(ev.args ?? {})}`;
		case "tool_execution_update":
			return `tool_execution_update ${ev.toolCallId} ${q(joinText(ev.partialResult?.content))}`;
		case "tool_execution_end":
			return `tool_execution_end ${ev.toolCallId} ${ev.toolName} error=${ev.isError} ${q(resultText(joinText(ev.result?.content)))}`;
	}
	return `unknown ${ev.type}`;
}

const counts = new Map();
const bump = (k) => {
	const n = (counts.get(k) ?? 0) + 1;
	counts.set(k, n);
	return n;
};
agent.subscribe((ev) => {
	add(traceLine(ev));
	const keys = [[ev.type, bump(ev.type)]];
	if (ev.type === "message_update") {
		const k = `message_update:${ev.assistantMessageEvent.type}`;
		keys.push([k, bump(k)]);
	}
	let pending;
	for (const tg of sc.triggers ?? []) {
		for (const [k, n] of keys) {
			if (tg.on.event === k && tg.on.nth === n) {
				if (tg.do === "throw") throw new Error(tg.text);
				const r = pending ? pending.then(() => run(tg)) : run(tg);
				if (r instanceof Promise) pending = r;
			}
		}
	}
	return pending;
});

for (const step of sc.script ?? []) {
	await run(step);
	await agent.waitForIdle();
}
const s = agent.state;
add(
	`state messages=[${s.messages.map((m) => m.role).join(",")}] streaming=${s.isStreaming} error=${q(s.errorMessage)} pending=${s.pendingToolCalls.size} queued=${agent.hasQueuedMessages()}`,
);
process.stdout.write(out.map((l, i) => (reps[i] > 1 ? `${l} x${reps[i]}` : l)).join("\n") + "\n");
