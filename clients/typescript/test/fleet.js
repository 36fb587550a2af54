// The test fleet: real worker (and console) processes, built from this
// repository, with the worker's embedded NATS server on a free port.
//
// Binaries: $AGENTFLEET_BIN_DIR (worker, submit, console, nats-server;
// .ci/run builds them there), else they are built once per test process
// with `go build`.
import { spawn, execFile } from "node:child_process";
import { mkdtempSync, rmSync, existsSync, createWriteStream } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";
import { createServer } from "node:net";
import { promisify } from "node:util";

export const pkgDir = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const repoDir = resolve(pkgDir, "..", "..");
const run = promisify(execFile);

/** @type {Set<import("node:child_process").ChildProcess>} */
const children = new Set();
const tmpDirs = new Set();
process.on("exit", () => {
  for (const c of children) if (c.exitCode === null) c.kill("SIGKILL");
  for (const d of tmpDirs) rmSync(d, { recursive: true, force: true });
});

/** A fresh temporary directory, removed when the process exits. @param {string} name */
export function tempDir(name) {
  const d = mkdtempSync(join(tmpdir(), `agentfleet-ts-${name}-`));
  tmpDirs.add(d);
  return d;
}

let built;
/** The directory of the worker, submit and console binaries. */
export function binaries() {
  built ??= (async () => {
    const dir = process.env.AGENTFLEET_BIN_DIR;
    if (dir) {
      for (const b of ["worker", "submit", "console", "nats-server"]) {
        if (!existsSync(join(dir, b))) throw new Error(`AGENTFLEET_BIN_DIR=${dir} has no ${b}: go build -o ${dir}/ ./cmd/worker ./cmd/submit ./cmd/console github.com/nats-io/nats-server/v2`);
      }
      return dir;
    }
    const out = tempDir("bin");
    const t0 = Date.now();
    await run("go", ["build", "-o", out + "/", "./cmd/worker", "./cmd/submit", "./cmd/console", "github.com/nats-io/nats-server/v2"], {
      cwd: repoDir,
      env: { ...process.env, GOFLAGS: `${process.env.GOFLAGS ?? ""} -mod=mod`.trim() },
    });
    console.log(`# built the worker, submit, console and nats-server in ${((Date.now() - t0) / 1000).toFixed(1)} s (set AGENTFLEET_BIN_DIR to skip)`);
    return out;
  })();
  return built;
}

/** A free TCP port on 127.0.0.1. */
export function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.unref();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const { port } = /** @type {import("node:net").AddressInfo} */ (s.address());
      s.close(() => res(port));
    });
  });
}

/**
 * Starts a real nats-server (the version go.mod pins) without JetStream, on
 * a free port, and waits until it takes connections: what "JetStream down"
 * looks like to a client.
 * @returns {Promise<{url: string, close(): Promise<void>}>}
 */
export async function startNatsWithoutJetStream() {
  const bin = await binaries();
  const port = await freePort();
  const proc = spawn(join(bin, "nats-server"), ["-a", "127.0.0.1", "-p", String(port)], { stdio: ["ignore", "ignore", "pipe"] });
  children.add(proc);
  const exited = new Promise((res) => proc.on("exit", () => (children.delete(proc), res(undefined))));
  await new Promise((res, rej) => {
    const rl = createInterface({ input: /** @type {import("node:stream").Readable} */ (proc.stderr) });
    rl.on("line", (line) => {
      if (line.includes("Server is ready")) res(undefined);
    });
    exited.then(() => rej(new Error("nats-server exited before it was ready")));
  });
  proc.stderr?.resume();
  return {
    url: `nats://127.0.0.1:${port}`,
    async close() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGTERM");
      await exited;
    },
  };
}

/**
 * Starts a worker process and waits until it has created the streams and
 * pulls. Without --nats in args it starts its embedded NATS server (on
 * opts.port, else a free one): url says where.
 * @param {string[]} args
 * @param {{port?: number, dataDir?: string, name?: string}} [opts]
 */
export async function startWorker(args = [], opts = {}) {
  const bin = await binaries();
  const name = opts.name ?? "worker";
  const full = ["--log-format", "json", "--metrics-addr", "", "--drain-timeout", "2s", ...args];
  if (!args.includes("--nats")) {
    const port = opts.port ?? (await freePort());
    full.push("--nats-listen", `127.0.0.1:${port}`, "--data-dir", opts.dataDir ?? tempDir(name));
  }
  const logPath = join(tempDir(`${name}-log`), "worker.log");
  const log = createWriteStream(logPath);
  const proc = spawn(join(bin, "worker"), full, {
    env: { ...process.env, OPENAI_API_KEY: "", OPENAI_BASE_URL: "", NATS_URL: "" },
    stdio: ["ignore", "ignore", "pipe"],
  });
  children.add(proc);
  const exited = new Promise((res) => proc.on("exit", (code, sig) => (children.delete(proc), res({ code, sig }))));
  let url = "";
  const ready = new Promise((res, rej) => {
    const rl = createInterface({ input: /** @type {import("node:stream").Readable} */ (proc.stderr) });
    rl.on("line", (line) => {
      log.write(line + "\n");
      let rec;
      try {
        rec = JSON.parse(line);
      } catch {
        return;
      }
      if (rec.msg?.startsWith("embedded NATS server started")) url = rec.url;
      if (rec.msg === "worker started") res(undefined);
    });
    exited.then(({ code, sig }) => rej(new Error(`worker exited (${code ?? sig}) before it was ready; log: ${logPath}`)));
  });
  const timer = setTimeout(() => proc.kill("SIGKILL"), 60_000);
  try {
    await ready;
  } finally {
    clearTimeout(timer);
  }
  return {
    proc,
    url,
    logPath,
    /** SIGTERM, and wait for the exit. */
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGTERM");
      await exited;
    },
    /** kill -9, and wait for the process to be gone. */
    async kill() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
      await exited;
    },
  };
}

/**
 * Starts the console binary on a free port and waits until it answers.
 * @param {string} natsUrl @param {string[]} args
 * @param {{port?: number}} [opts]
 */
export async function startConsole(natsUrl, args = [], opts = {}) {
  const bin = await binaries();
  const port = opts.port ?? (await freePort());
  const proc = spawn(join(bin, "console"), ["--nats", natsUrl, "--addr", `127.0.0.1:${port}`, "--log-format", "json", ...args], {
    env: { ...process.env, NATS_URL: "" },
    stdio: ["ignore", "ignore", "pipe"],
  });
  children.add(proc);
  let stderr = "";
  proc.stderr?.on("data", (d) => (stderr = (stderr + d).slice(-8192)));
  const exited = new Promise((res) => proc.on("exit", (code, sig) => (children.delete(proc), res({ code, sig }))));
  const base = `http://127.0.0.1:${port}`;
  // Ready when the port takes connections (any HTTP answer will do).
  for (let i = 0; ; i++) {
    if (proc.exitCode !== null) throw new Error(`console exited: ${stderr}`);
    try {
      await fetch(base + "/api/session", { signal: AbortSignal.timeout(2000) });
      break;
    } catch {
      if (i > 300) throw new Error(`console not up after 30 s: ${stderr}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  return {
    base,
    port,
    proc,
    stderr: () => stderr,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGTERM");
      await exited;
    },
    async kill() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
      await exited;
    },
  };
}

/** Runs the submit binary; resolves {code, stdout, stderr}. @param {string} natsUrl @param {string[]} args */
export async function submit(natsUrl, args) {
  const bin = await binaries();
  return new Promise((res) => {
    execFile(join(bin, "submit"), args, { env: { ...process.env, NATS_URL: natsUrl, NO_COLOR: "1" }, maxBuffer: 256 << 20 }, (err, stdout, stderr) => {
      res({ code: err ? (/** @type {any} */ (err).code ?? 1) : 0, stdout, stderr });
    });
  });
}

/**
 * Waits until check() returns a truthy value (polling every interval ms): for
 * states that have no event to wait on. Fails after timeout ms with what.
 * @template T @param {() => Promise<T> | T} check @param {string} what @param {number} [timeout] @param {number} [interval]
 * @returns {Promise<NonNullable<T>>}
 */
export async function waitFor(check, what, timeout = 30_000, interval = 50) {
  const end = Date.now() + timeout;
  for (;;) {
    const v = await check();
    if (v) return /** @type {NonNullable<T>} */ (v);
    if (Date.now() > end) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, interval));
  }
}

/** A faux request that streams n text deltas of 4 characters. @param {number} n */
export function manyDeltas(n) {
  return {
    model: "faux/many",
    prompt: "talk",
    faux: { tokenSize: 1, responses: [{ content: [{ type: "text", text: "abcd".repeat(n) }] }] },
  };
}

/** A faux request whose first turn calls the sleep tool for s seconds, then answers. @param {number} s */
export function sleeper(s) {
  return {
    model: "faux/slow",
    prompt: "Count to three",
    tools: ["sleep"],
    faux: {
      responses: [
        { content: [{ type: "text", text: "Let me take my time. " }, { type: "toolCall", id: "s1", name: "sleep", arguments: { seconds: s } }], stopReason: "toolUse" },
        { content: [{ type: "text", text: "One, two, three." }] },
        { content: [{ type: "text", text: "Un, deux, trois." }] },
        { content: [{ type: "text", text: "Eins, zwei, drei." }] },
      ],
    },
  };
}

/**
 * A faux request whose calculator call waits for a person's answer (it
 * waits as long as need be: steer and follow up meanwhile, then answer),
 * then answers one text per turn.
 * @param {string} [prompt]
 */
export function gated(prompt = "What is 1234*5678?") {
  return {
    model: "faux/gated",
    prompt,
    tools: ["calculator"],
    approval: { tools: ["calculator"] },
    faux: {
      responses: [
        { content: [{ type: "toolCall", id: "c1", name: "calculator", arguments: { expression: "1234*5678" } }], stopReason: "toolUse" },
        { content: [{ type: "text", text: "One, two, three." }] },
        { content: [{ type: "text", text: "Un, deux, trois." }] },
        { content: [{ type: "text", text: "Eins, zwei, drei." }] },
      ],
    },
  };
}
