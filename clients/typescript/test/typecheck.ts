// Compiled by tsc (test/types.test.js), never run: the package's types
// used as an application would use them.
import { connect, EventsGoneError, formatEnvelope, RunNotFoundError, ScheduleError, Transcript, type Envelope, type RunRequest } from "@agentfleet/client";
import { ConsoleClient } from "@agentfleet/client/console";

export async function nodeUse(): Promise<string> {
  const client = await connect({ servers: "nats://127.0.0.1:4222" });
  const req: RunRequest = { prompt: "What is 6*7?", tools: ["calculator"], limits: { maxTurns: 5 }, metadata: { team: "docs" } };
  const { id, seq, duplicate } = await client.submit(req, { queue: "default" });
  void seq, duplicate;
  let text = "";
  const t = new Transcript();
  for await (const env of client.follow(id)) {
    t.apply(env);
    const ev = env.event;
    switch (ev.type) {
      case "message_update":
        if (ev.assistantMessageEvent.type === "text_delta") text += ev.assistantMessageEvent.delta ?? "";
        break;
      case "run_finished":
        text += ` (${ev.status}${ev.reason ? ": " + ev.reason : ""}, ${ev.usage.totalTokens} tokens)`;
        break;
      case "control_rejected":
        text += ` (${ev.kind} ${ev.controlSeq} not taken: ${ev.reason})`;
        break;
      case "tool_approval_requested":
        await client.approve(id, ev.toolCallId, { by: "alice", key: `${ev.toolCallId}-ok` });
        break;
    }
    const line: string = formatEnvelope(env);
    void line;
  }
  for await (const env of client.follow(id, { includeUnknown: true, from: 5 })) {
    const type: string = env.event.type;
    void type;
  }
  const followed = client.follow(id, { signal: AbortSignal.timeout(60_000) });
  try {
    for await (const env of followed) void env;
  } catch (err) {
    if (err instanceof EventsGoneError) text += ` (${err.code}: ${err.state ?? `from ${err.from}`})`;
  }
  const cursor = followed.cursor();
  const done: true | undefined = cursor.finished;
  void done;
  for await (const env of client.follow(id, cursor)) void env;
  await client.steer(id, "Use metric units.", { key: "k1" });
  await client.followUp(id, { role: "user", content: "And in Fahrenheit?" });
  const { seq: abortSeq } = await client.abort(id, { reason: "changed my mind" });
  void abortSeq;
  const rec = await client.status(id);
  const state: "queued" | "running" | "succeeded" | "failed" | "aborted" = rec.state;
  void state;
  const page = await client.list({ state: "failed", limit: 20, since: new Date(Date.now() - 3600_000) });
  const more = await client.list({ before: page.next });
  void more;
  for (const p of await client.approvals()) await client.deny(p.run, p.toolCallId, { reason: "not now" });
  const r = await client.result(id);
  try {
    const sseq: number = await client.createSchedule({ name: "nightly", cron: "0 0 9 * * MON", timeZone: "Europe/Berlin", request: { prompt: "Triage." } });
    await client.replaceSchedule({ name: "nightly", queue: "default", every: "1h", overlap: "skip", request: { prompt: "Triage." } }, { timeoutMs: 5000 });
    await client.pauseSchedule("nightly");
    await client.resumeSchedule("nightly");
    const fired: string = await client.triggerSchedule("nightly");
    await client.deleteSchedule("nightly");
    void [sseq, fired];
  } catch (err) {
    if (err instanceof ScheduleError && err.code === "schedule_invalid") return err.problems.join("; ");
  }
  try {
    await client.status("nope");
  } catch (err) {
    if (err instanceof RunNotFoundError) return err.run;
  }
  await client.close();
  return r.text + text;
}

export async function browserUse(): Promise<void> {
  const c = new ConsoleClient({ baseUrl: "http://127.0.0.1:8080", token: "0123456789abcdef" });
  const f = c.follow("r1", { from: 10 });
  for await (const env of f) {
    const e: Envelope = env;
    if (e.event.type === "message_end" && e.event.message.role === "assistant") console.log(e.event.message.stopReason);
  }
  const again = c.follow("r1", f.cursor());
  void again;
  await c.steer("r1", "shorter");
  await c.abort("r1", { reason: "x" });
}
