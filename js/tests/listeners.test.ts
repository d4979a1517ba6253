// Every model listener and every window/document listener of a view goes through `Listeners`
// (src/lib/request.ts), so a view's cleanup is one `dispose()` and none is left behind: a grep over
// js/src for `x.on(` / `x.off(` and `window|document.addEventListener(` outside Listeners itself and
// the few listed exceptions (each with its reason). Planted violations (a bare model.on in a copy of
// a real view, a window listener, a document listener) are found; the Listeners calls are not.
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { describe, expect, it } from "vitest";

const SRC = join(__dirname, "..", "src");

/** Files allowed to listen directly, and why. */
const ALLOWED: Record<string, string> = {
  "lib/request.ts": "Listeners itself",
  "lib/rpc.ts": "one listener per request, removed when its answer (or the timeout) arrives",
  "lib/events.ts": "the Emitter (the on/off half of a model)",
  "lib/keys.ts": "one capture-phase keydown listener per page, installed once for every view on purpose",
};

const RULES: [RegExp, string][] = [
  [/(?<!\bsuper)\.(on|off)\(/, "a model listener outside Listeners (use listeners.model(model, event, cb))"],
  [/\b(window|document|globalThis)\s*\.\s*(add|remove)EventListener\(/, "a page listener outside Listeners (use listeners.dom(window, type, cb))"],
];

/** `file:line: why` for each direct listener in `text` (line comments ignored). */
export function violations(file: string, text: string): string[] {
  if (file in ALLOWED) return [];
  const out: string[] = [];
  text.split("\n").forEach((line, i) => {
    const code = line.replace(/\/\/.*$/, "");
    for (const [re, why] of RULES) if (re.test(code)) out.push(`${file}:${i + 1}: ${why}`);
  });
  return out;
}

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? sources(p) : p.endsWith(".ts") ? [p] : [];
  });
}

describe("listeners go through Listeners", () => {
  it("no view listens to its model, the window or the document directly", () => {
    const files = sources(SRC);
    expect(files.length).toBeGreaterThan(30);
    const found = files.flatMap((p) => violations(relative(SRC, p).split("\\").join("/"), readFileSync(p, "utf8")));
    expect(found).toEqual([]);
  });

  it("finds planted violations, and not the Listeners calls", () => {
    const attention = readFileSync(join(SRC, "attention.ts"), "utf8");
    expect(attention).toContain("listeners.model(model, ");
    const reverted = attention.replace("listeners.model(model, ", "model.on(");
    expect(violations("attention.ts", reverted)).toEqual([expect.stringMatching(/^attention\.ts:\d+: a model listener outside Listeners/)]);
    expect(violations("view.ts", '  window.addEventListener("resize", onResize);')).toHaveLength(1);
    expect(violations("view.ts", "  document . removeEventListener('keydown', onKey);")).toHaveLength(1);
    expect(violations("view.ts", '  this.model.off("change:x", cb);')).toHaveLength(1);
    expect(violations("view.ts", [
      '  listeners.model(model, "change:x", cb);',
      '  listeners.dom(window, "resize", onResize);',
      "  super.on(event, cb);",
      '  // model.on("change:x") is what Listeners does',
      '  button.addEventListener("click", go); // the view\'s own element: removed with it',
    ].join("\n"))).toEqual([]);
    expect(violations("lib/rpc.ts", '  model.on("msg:custom", onMsg);')).toEqual([]);
  });
});
