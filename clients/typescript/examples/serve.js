#!/usr/bin/env node
// Serves the example page (examples/follow.html) and the package's files,
// and forwards /api/ to an agentfleet console, so that the page and the
// console's API share one origin: the console sends no CORS headers, and
// its control POSTs must come from its own origin (docs/console.md). Any
// reverse proxy that serves your app and the console's /api/ under one
// origin does the same.
//
//   node examples/serve.js --console http://127.0.0.1:8080 [--addr 127.0.0.1:8090]
//   then open http://127.0.0.1:8090/examples/follow.html?run=RUN
//
// With a console that wants a token, log in once through the proxy
// (http://127.0.0.1:8090/api/session?token=TOKEN keeps it in the console's
// cookie), or pass --token TOKEN to add it to every forwarded request.
import { createServer, request as httpRequest } from "node:http";
import { readFile } from "node:fs/promises";
import { extname, join, normalize, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const types = { ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".json": "application/json" };
// Hop-by-hop headers, not forwarded.
const hop = new Set(["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"]);

/**
 * Starts the server; resolves its base URL and a close function.
 * @param {{console: string, addr?: string, token?: string}} o
 */
export function serve(o) {
  const target = new URL(o.console);
  const [host, port] = (o.addr ?? "127.0.0.1:0").split(":");
  const server = createServer(async (req, res) => {
    const url = new URL(req.url ?? "/", "http://x");
    if (url.pathname.startsWith("/api/")) return forward(req, res);
    if (req.method !== "GET" && req.method !== "HEAD") return void res.writeHead(405).end();
    if (url.pathname === "/favicon.ico") return void res.writeHead(204).end();
    const path = url.pathname === "/" ? "/examples/follow.html" : url.pathname;
    const file = normalize(join(root, path));
    const top = file.slice(root.length).split("/")[1];
    if (!file.startsWith(root + "/") || !["examples", "src", "types"].includes(top)) return void res.writeHead(404).end("not found");
    try {
      const body = await readFile(file);
      res.writeHead(200, {
        "Content-Type": types[/** @type {keyof types} */ (extname(file))] ?? "application/octet-stream",
        "Cache-Control": "no-store",
        "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'",
        "X-Content-Type-Options": "nosniff",
      });
      res.end(req.method === "HEAD" ? undefined : body);
    } catch {
      res.writeHead(404).end("not found");
    }
  });

  /** @param {import("node:http").IncomingMessage} req @param {import("node:http").ServerResponse} res */
  function forward(req, res) {
    /** @type {Record<string, string | string[]>} */
    const headers = {};
    for (const [k, v] of Object.entries(req.headers)) if (v !== undefined && !hop.has(k)) headers[k] = v;
    // The console answers only its own names in Host, and only its own
    // origin in Origin (docs/console.md, Safety): this server sends it its
    // address as Host, and as Origin the console's own when the browser's is
    // this server's (the page's origin, which the console does not know),
    // "null" (refused) for any other. Behind a proxy that keeps the Host
    // and Origin of a public name, start the console with --public-host.
    const self = `http://${req.headers.host}`;
    headers.host = target.host;
    if (headers.origin === self) headers.origin = target.origin;
    else if (headers.origin) headers.origin = "null";
    if (o.token && !headers.authorization) headers.authorization = `Bearer ${o.token}`;
    const up = httpRequest({ host: target.hostname, port: target.port, method: req.method, path: req.url, headers }, (ur) => {
      /** @type {Record<string, string | string[]>} */
      const h = {};
      for (const [k, v] of Object.entries(ur.headers)) if (v !== undefined && !hop.has(k)) h[k] = v;
      // The console's token cookie, set for this origin; a redirect stays here.
      if (typeof h.location === "string" && h.location.startsWith(target.origin)) h.location = h.location.slice(target.origin.length);
      res.writeHead(ur.statusCode ?? 502, h);
      res.flushHeaders();
      ur.pipe(res);
    });
    up.on("error", (err) => {
      if (!res.headersSent) res.writeHead(502, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ error: `console at ${target.origin}: ${err.message}` }));
    });
    req.on("aborted", () => up.destroy());
    res.on("close", () => up.destroy());
    req.pipe(up);
  }

  return new Promise((res) => {
    server.listen(Number(port), host, () => {
      const a = /** @type {import("node:net").AddressInfo} */ (server.address());
      res({
        base: `http://${host}:${a.port}`,
        close: () =>
          new Promise((r) => {
            server.closeAllConnections();
            server.close(() => r(undefined));
          }),
      });
    });
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  const flag = (/** @type {string} */ name) => {
    const i = args.indexOf(name);
    return i >= 0 ? args[i + 1] : undefined;
  };
  const consoleUrl = flag("--console");
  if (!consoleUrl) {
    console.error("usage: node examples/serve.js --console http://127.0.0.1:8080 [--addr 127.0.0.1:8090] [--token TOKEN]");
    process.exit(2);
  }
  const { base } = await serve({ console: consoleUrl, addr: flag("--addr") ?? "127.0.0.1:8090", token: flag("--token") });
  console.log(`serving ${base}/examples/follow.html?run=RUN (the console: ${consoleUrl})`);
}
