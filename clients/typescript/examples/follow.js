// The example page: follows a run live through the console (and steers or
// aborts it) with @agentfleet/client/console. Everything a run carries is
// put into the page as text (textContent), never as HTML.
import { ConsoleClient, Transcript } from "../src/console.js";

const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));
const params = new URLSearchParams(location.search);
// The console: this origin, unless ?console= names another that allows it
// (the console itself sends no CORS headers: serve the page through a proxy).
const client = new ConsoleClient({ baseUrl: params.get("console") ?? "" });

/** @type {import("../src/console.js").ConsoleFollowStream | null} */
let follow = null;

function el(/** @type {string} */ tag, /** @type {string} */ cls, /** @type {string} */ text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text) e.textContent = text;
  return e;
}

/** One message as a block of text. @param {any} m @param {boolean} streaming */
function render(m, streaming) {
  const box = el("div", `msg ${m.role}${m.stopReason === "error" || m.isError ? " error" : ""}${streaming ? " streaming" : ""}`, "");
  box.append(el("span", "role", m.role === "toolResult" ? `tool result · ${m.toolName}` : m.role));
  const blocks = typeof m.content === "string" ? [{ type: "text", text: m.content }] : m.content ?? [];
  for (const b of blocks) {
    if (b.type === "text") box.append(el("span", "", b.text));
    else if (b.type === "thinking") box.append(el("span", "thinking", b.thinking));
    else if (b.type === "toolCall") box.append(el("div", "tool", `→ ${b.name}(${JSON.stringify(b.arguments)})`));
    else if (b.type === "image") box.append(el("span", "tool", `[image ${b.mimeType}]`));
  }
  if (m.errorMessage) box.append(el("div", "tool", m.errorMessage));
  return box;
}

/** @param {Transcript} t */
function show(t) {
  const out = $("transcript");
  out.replaceChildren(...t.messages.map((m) => render(m, false)), ...(t.partial ? [render(t.partial, true)] : []));
}

async function start(/** @type {string} */ run) {
  follow?.close();
  $("error").hidden = true;
  $("transcript").replaceChildren();
  $("status").textContent = `following ${run} …`;
  document.body.dataset.state = "following";
  const t = new Transcript();
  let events = 0;
  let pending = false;
  const f = (follow = client.follow(run));
  try {
    for await (const env of f) {
      events++;
      t.apply(env);
      const ev = env.event;
      if (ev.type === "run_started") $("status").textContent = `running on ${ev.worker} (attempt ${ev.attempt}, ${ev.model ? ev.model.provider + "/" + ev.model.id : "default model"})`;
      if (ev.type === "tool_execution_start") $("status").textContent = `running ${ev.toolName} …`;
      if (ev.type === "tool_approval_requested") $("status").textContent = `waiting for approval of ${ev.toolName} (${ev.toolCallId})`;
      if (ev.type === "run_finished") {
        $("status").textContent = `${ev.status}${ev.reason ? " (" + ev.reason + ")" : ""} · ${ev.turns} turn(s) · ${ev.usage.totalTokens} tokens · ${(ev.durationMs / 1000).toFixed(1)} s${ev.error ? " · " + ev.error : ""}`;
      }
      $("events").textContent = String(events);
      $("cursor").textContent = String(env.streamSeq);
      $("connects").textContent = String(f.connects);
      // Redraw once per frame, however many events came.
      if (!pending) {
        pending = true;
        requestAnimationFrame(() => {
          pending = false;
          show(t);
        });
      }
    }
    show(t);
    document.body.dataset.state = t.finished ? "finished" : "stopped";
    document.body.dataset.final = t.finalText();
  } catch (err) {
    $("error").textContent = String(/** @type {Error} */ (err).message ?? err);
    $("error").hidden = false;
    document.body.dataset.state = "error";
  }
}

$("pick").addEventListener("submit", (e) => {
  e.preventDefault();
  const run = /** @type {HTMLInputElement} */ ($("run")).value.trim();
  history.replaceState(null, "", `?run=${encodeURIComponent(run)}`);
  start(run);
});

$("steer").addEventListener("submit", async (e) => {
  e.preventDefault();
  const input = /** @type {HTMLInputElement} */ ($("text"));
  try {
    const { seq } = await client.steer(/** @type {string} */ (follow?.run), input.value);
    input.value = "";
    $("status").textContent = `steering sent (control sequence ${seq})`;
  } catch (err) {
    $("error").textContent = String(/** @type {Error} */ (err).message);
    $("error").hidden = false;
  }
});

$("abort").addEventListener("click", async () => {
  try {
    await client.abort(/** @type {string} */ (follow?.run), { reason: "aborted from the example page" });
  } catch (err) {
    $("error").textContent = String(/** @type {Error} */ (err).message);
    $("error").hidden = false;
  }
});

// Controls only where the console allows them.
client.session().then(
  (s) => ($("steer").hidden = !s.allowControl),
  () => {},
);

const run = params.get("run");
if (run) {
  /** @type {HTMLInputElement} */ ($("run")).value = run;
  start(run);
}
