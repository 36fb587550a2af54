// Renders markdown cases with the console's markdown module, as the
// console serves it, in node on the DOM stub (domstub.mjs), and reports
// each result serialised (markdown_test.go checks it).
//
//   node --experimental-vm-modules markdown_cases.mjs <console static URL> < cases.json
//
// cases.json: [{"name": ..., "text": ...}, ...]. The report: {"sinks":
// [...], "errors": [...], "cases": [{"name", "html", "ms"}, ...]}, html
// being serialize's text of the div renderMarkdown returned.
import vm from "node:vm";
import { Node, Document, sinks, serialize, runScripts } from "./domstub.mjs";

const [base] = process.argv.slice(2);
if (!base) {
  console.error("usage: node --experimental-vm-modules markdown_cases.mjs <console URL> < cases.json");
  process.exit(2);
}
const errors = [];
process.on("uncaughtException", (e) => errors.push("uncaught: " + (e && e.stack || e)));
process.on("unhandledRejection", (e) => errors.push("unhandled rejection: " + (e && e.stack || e)));

let input = "";
for await (const chunk of process.stdin) input += chunk;
const cases = JSON.parse(input);

const document = new Document();
const ctx = vm.createContext({ document, Node, console });
await runScripts(ctx, [{ url: new URL("/static/markdown.js", base).href, module: true }]);
const renderMarkdown = vm.runInContext("renderMarkdown", ctx);
const out = [];
for (const c of cases) {
  const start = performance.now();
  let html = "";
  try {
    html = serialize(renderMarkdown(c.text, document));
  } catch (e) {
    errors.push(c.name + ": " + (e && e.stack || e));
  }
  out.push({ name: c.name, html, ms: Math.round(performance.now() - start) });
}
process.stdout.write(JSON.stringify({ sinks, errors, cases: out }), () => process.exit(0));
