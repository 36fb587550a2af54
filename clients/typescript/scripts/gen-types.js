#!/usr/bin/env node
// Generates the package's protocol types from the JSON Schema of the wire
// protocol (protocol/*.schema.json, themselves generated from the Go wire
// types):
//
//   types/protocol.d.ts  every definition of the five schemas as a TypeScript
//                        type, and the documents themselves (Envelope,
//                        RunRequest, ControlBody, RunRecord, Presence)
//   src/protocol.js      the protocol version and the event types, as values
//
// Run it after `go generate ./protocol`: node scripts/gen-types.js (or npm run
// gen). `node --test` fails while the checked-in files differ from what it
// writes. It needs nothing but node: the schemas use a small part of JSON
// Schema (objects, arrays, $ref, oneOf/anyOf, const, enum), and that part is
// all it translates; validation keywords (pattern, bounds, if/then) become
// doc comments or are left to the worker, which checks every request.
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = join(here, "..");

/** The schema files, their root type, and the prefix of a definition whose name another file already uses differently. */
export const schemas = [
  { file: "event.schema.json", root: "Envelope", prefix: "Event" },
  { file: "run-request.schema.json", root: "RunRequest", prefix: "Request" },
  { file: "control.schema.json", root: "ControlBody", prefix: "Control" },
  { file: "record.schema.json", root: "RunRecord", prefix: "Record" },
  { file: "presence.schema.json", root: "Presence", prefix: "Presence" },
  { file: "schedule.schema.json", root: "Schedule", prefix: "Schedule" },
];

const canon = (v) => JSON.stringify(v, (_, x) => (x && typeof x === "object" && !Array.isArray(x) ? Object.fromEntries(Object.entries(x).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) : x));

const ident = /^[A-Za-z_$][A-Za-z0-9_$]*$/;
const key = (k) => (ident.test(k) ? k : JSON.stringify(k));

function comment(s, indent) {
  const parts = [];
  if (s.description) parts.push(s.description);
  const notes = [];
  if (s.pattern) notes.push(`pattern \`${s.pattern}\``);
  if (s.minimum !== undefined) notes.push(`minimum ${s.minimum}`);
  if (s.maximum !== undefined) notes.push(`maximum ${s.maximum}`);
  if (s.minLength !== undefined) notes.push(`minLength ${s.minLength}`);
  if (s.maxLength !== undefined) notes.push(`maxLength ${s.maxLength}`);
  if (s.maxItems !== undefined) notes.push(`maxItems ${s.maxItems}`);
  if (s.format) notes.push(`format ${s.format}`);
  if (notes.length) parts.push(`(${notes.join(", ")})`);
  if (!parts.length) return "";
  const text = parts.join(" ").replaceAll("*/", "*\\/");
  return `${indent}/** ${text} */\n`;
}

/** A subschema that only adds constraints (which fields are required) to the object it sits in. */
function constraintOnly(s) {
  if (typeof s !== "object" || s === null) return false;
  for (const [k, v] of Object.entries(s)) {
    if (k === "required" || k === "description") continue;
    if (k === "properties" && Object.values(v).every((p) => !p.type && !p.$ref && !p.oneOf && !p.anyOf && p.const === undefined && !p.enum)) continue;
    return false;
  }
  return true;
}

class Generator {
  constructor() {
    this.out = [];
    this.names = new Map(); // def name -> canonical JSON (first file's)
  }

  file({ file, root, prefix }) {
    const schema = JSON.parse(readFileSync(join(pkg, "..", "..", "protocol", file), "utf8"));
    const defs = schema.$defs ?? {};
    const rename = new Map();
    const emit = [];
    for (const [name, def] of Object.entries(defs)) {
      const c = canon(def);
      if (!this.names.has(name)) {
        this.names.set(name, c);
        rename.set(name, name);
        emit.push(name);
      } else if (this.names.get(name) === c) {
        rename.set(name, name); // the same type: declared once
      } else {
        rename.set(name, prefix + name);
        this.names.set(prefix + name, c);
        emit.push(name);
      }
    }
    this.rename = rename;
    this.out.push(`// ${file}: ${schema.title}\n`);
    const { $defs, $schema, $id, title, ...rootSchema } = schema;
    this.out.push(comment(rootSchema, ""));
    this.out.push(`export type ${root} = ${this.type(rootSchema, "")};\n\n`);
    for (const name of emit) {
      const def = defs[name];
      this.out.push(comment(def, ""));
      this.out.push(`export type ${rename.get(name)} = ${this.type(def, "")};\n\n`);
    }
  }

  type(s, indent) {
    if (s === true || (typeof s === "object" && Object.keys(s).filter((k) => k !== "description").length === 0)) return "unknown";
    if (s.$ref) {
      const name = s.$ref.replace(/^#\/\$defs\//, "");
      const r = this.rename.get(name);
      if (!r) throw new Error(`unknown $ref ${s.$ref}`);
      return r;
    }
    if (s.const !== undefined) return JSON.stringify(s.const);
    if (s.enum) return s.enum.map((v) => JSON.stringify(v)).join(" | ");
    const alts = s.oneOf ?? s.anyOf;
    if (alts && !alts.every(constraintOnly)) {
      return alts.map((a) => this.type(a, indent)).map((t) => (t.includes(" | ") && !t.startsWith("{") ? `(${t})` : t)).join(" | ");
    }
    let t = s.type;
    if (Array.isArray(t)) return t.map((x) => this.type({ ...s, type: x }, indent)).join(" | ");
    if (t === undefined && s.properties) t = "object";
    switch (t) {
      case "string":
        return "string";
      case "integer":
      case "number":
        return "number";
      case "boolean":
        return "boolean";
      case "null":
        return "null";
      case "array":
        return s.items ? this.wrapArray(this.type(s.items, indent)) : "unknown[]";
      case "object":
        return this.object(s, indent, alts);
    }
    throw new Error(`cannot type schema ${JSON.stringify(s).slice(0, 200)}`);
  }

  wrapArray(t) {
    return /^[A-Za-z0-9_]+$/.test(t) ? `${t}[]` : `Array<${t}>`;
  }

  object(s, indent, alts) {
    const props = s.properties ?? {};
    const required = new Set(s.required ?? []);
    const inner = indent + "  ";
    const lines = [];
    for (const [k, p] of Object.entries(props)) {
      lines.push(comment(p, inner) + `${inner}${key(k)}${required.has(k) ? "" : "?"}: ${this.type(p, inner)};\n`);
    }
    const ap = s.additionalProperties;
    if (ap && ap !== true && Object.keys(props).length === 0) {
      return `{ [key: string]: ${this.type(ap, inner)} }`;
    }
    if (Object.keys(props).length === 0 && ap === undefined) return "{ [key: string]: unknown }";
    let body = `{\n${lines.join("")}${indent}}`;
    if (alts) {
      // oneOf/anyOf of "this field is required" constraints: one object
      // type per alternative.
      const variants = alts.map((a) => {
        const req = (a.required ?? []).map((k) => `${key(k)}: ${this.type(props[k] ?? true, inner)}`);
        return `{ ${req.join("; ")} }`;
      });
      body = `${body} & (${variants.join(" | ")})`;
    }
    return body;
  }
}

/** The generated files, by path relative to the package. */
export function generate() {
  const g = new Generator();
  let version = "";
  for (const s of schemas) {
    g.file(s);
    const schema = JSON.parse(readFileSync(join(pkg, "..", "..", "protocol", s.file), "utf8"));
    version = schema["x-protocol-version"];
  }
  const header = `// Code generated by scripts/gen-types.js from protocol/*.schema.json (protocol ${version}). DO NOT EDIT.\n\n`;
  const dts = header + g.out.join("").trimEnd() + "\n";

  const ev = JSON.parse(readFileSync(join(pkg, "..", "..", "protocol", "event.schema.json"), "utf8"));
  const consts = (union) => union.oneOf.map((r) => ev.$defs[r.$ref.replace("#/$defs/", "")].properties.type.const);
  const eventTypes = consts(ev.$defs.Event);
  const streamTypes = consts(ev.$defs.AssistantMessageEvent);
  const js =
    header +
    `/** The protocol version these types describe (docs/protocol.md). */\n` +
    `export const PROTOCOL_VERSION = ${JSON.stringify(version)};\n\n` +
    `/** Every event type of this protocol version: readers skip the envelopes of other types. */\n` +
    `export const EVENT_TYPES = Object.freeze(${JSON.stringify(eventTypes)});\n\n` +
    `/** The steps of the assistant stream (message_update's assistantMessageEvent.type). */\n` +
    `export const STREAM_EVENT_TYPES = Object.freeze(${JSON.stringify(streamTypes)});\n`;
  const jsTypes =
    header +
    `import type { Event, AssistantMessageEvent } from "../types/protocol.js";\n\n` +
    `export declare const PROTOCOL_VERSION: ${JSON.stringify(version)};\n` +
    `export declare const EVENT_TYPES: readonly Event["type"][];\n` +
    `export declare const STREAM_EVENT_TYPES: readonly AssistantMessageEvent["type"][];\n`;
  return { "types/protocol.d.ts": dts, "src/protocol.js": js, "src/protocol.d.ts": jsTypes };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  for (const [path, text] of Object.entries(generate())) {
    writeFileSync(join(pkg, path), text);
    console.log(`wrote ${path}`);
  }
}
