// A NATS server without JetStream, enough for a client: it speaks the core
// protocol (INFO, CONNECT, PING/PONG, SUB/UNSUB, PUB/HPUB) and routes
// messages between its own subscribers; a request nobody subscribes to gets
// the 503 "no responders" status, as nats-server answers a $JS.API request
// when JetStream is not enabled. What "JetStream down" looks like to a
// client, without a second server binary.
import { createServer } from "node:net";

/** @returns {Promise<{url: string, close(): Promise<void>}>} */
export function startFakeNats() {
  /** @type {Set<import("node:net").Socket>} */
  const sockets = new Set();
  /** @type {Array<{sock: import("node:net").Socket, sid: string, subject: string}>} */
  let subs = [];
  /** @param {string} pattern @param {string} subject */
  const matches = (pattern, subject) => {
    const p = pattern.split(".");
    const s = subject.split(".");
    for (let i = 0; i < p.length; i++) {
      if (p[i] === ">") return s.length > i;
      if (i >= s.length || (p[i] !== "*" && p[i] !== s[i])) return false;
    }
    return p.length === s.length;
  };
  const server = createServer((sock) => {
    sockets.add(sock);
    sock.on("close", () => {
      sockets.delete(sock);
      subs = subs.filter((s) => s.sock !== sock);
    });
    sock.on("error", () => {});
    sock.write(`INFO ${JSON.stringify({ server_id: "FAKE", server_name: "fake", version: "2.11.0", proto: 1, headers: true, max_payload: 1048576, jetstream: false })}\r\n`);
    let buf = Buffer.alloc(0);
    sock.on("data", (d) => {
      buf = Buffer.concat([buf, d]);
      for (;;) {
        const nl = buf.indexOf("\r\n");
        if (nl < 0) return;
        const line = buf.subarray(0, nl).toString();
        const [op, ...args] = line.split(" ");
        const OP = op.toUpperCase();
        if (OP === "PUB" || OP === "HPUB") {
          const total = Number(args[args.length - 1]);
          if (buf.length < nl + 2 + total + 2) return; // wait for the payload
          const payload = buf.subarray(nl + 2, nl + 2 + total);
          buf = buf.subarray(nl + 2 + total + 2);
          const subject = args[0];
          const reply = (OP === "PUB" ? args.length === 3 : args.length === 4) ? args[1] : "";
          const targets = subs.filter((s) => matches(s.subject, subject));
          for (const t of targets) {
            const r = reply ? ` ${reply}` : "";
            if (OP === "PUB") t.sock.write(Buffer.concat([Buffer.from(`MSG ${subject} ${t.sid}${r} ${payload.length}\r\n`), payload, Buffer.from("\r\n")]));
            else {
              const hdr = Number(args[args.length - 2]);
              t.sock.write(Buffer.concat([Buffer.from(`HMSG ${subject} ${t.sid}${r} ${hdr} ${payload.length}\r\n`), payload, Buffer.from("\r\n")]));
            }
          }
          if (targets.length === 0 && reply) {
            const hdr = "NATS/1.0 503\r\n\r\n";
            for (const t of subs.filter((s) => s.sock === sock && matches(s.subject, reply))) {
              sock.write(`HMSG ${reply} ${t.sid} ${hdr.length} ${hdr.length}\r\n${hdr}\r\n`);
            }
          }
          continue;
        }
        buf = buf.subarray(nl + 2);
        if (OP === "PING") sock.write("PONG\r\n");
        else if (OP === "SUB") subs.push({ sock, subject: args[0], sid: args[args.length - 1] });
        else if (OP === "UNSUB") subs = subs.filter((s) => !(s.sock === sock && s.sid === args[0]));
      }
    });
  });
  return new Promise((res) => {
    server.listen(0, "127.0.0.1", () => {
      const { port } = /** @type {import("node:net").AddressInfo} */ (server.address());
      res({
        url: `nats://127.0.0.1:${port}`,
        close: () =>
          new Promise((r) => {
            for (const s of sockets) s.destroy();
            server.close(() => r());
          }),
      });
    });
  });
}
