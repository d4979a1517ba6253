// @vitest-environment happy-dom
import { describe, expect, it } from "vitest";
import { Latest, Listeners } from "../src/lib/request";
import { tokenRows } from "../src/lib/tokens";

describe("lib/request: the latest-request guard", () => {
  it("drops an answer once a newer request began, after cancel() and after dispose()", () => {
    const g = new Latest();
    const first = g.start();
    expect(first()).toBe(true);
    const second = g.start();
    expect(first()).toBe(false); // a slow first answer arriving after the second click is not drawn
    expect(second()).toBe(true);
    g.cancel();
    expect(second()).toBe(false);
    const third = g.start();
    g.disposed = true; // the view closed
    expect(third()).toBe(false);
    expect(g.disposed).toBe(true);
    expect(g.start()()).toBe(false); // nothing starts after dispose
  });

  it("Listeners removes every model and DOM listener with one dispose()", () => {
    const handlers = new Map<string, Set<(...a: any[]) => void>>();
    const model = {
      get: () => undefined, set: () => undefined, save_changes: () => undefined, send: () => undefined,
      on: (e: string, cb: (...a: any[]) => void) => void (handlers.get(e) ?? handlers.set(e, new Set()).get(e)!).add(cb),
      off: (e?: string | null, cb?: ((...a: any[]) => void) | null) => void (e && cb && handlers.get(e)?.delete(cb)),
    };
    const el = document.createElement("button");
    let clicks = 0;
    let changes = 0;
    let extra = 0;
    const ls = new Listeners();
    ls.model(model, "change:x", () => changes++);
    ls.dom(el, "click", () => clicks++);
    ls.add(() => extra++);
    handlers.get("change:x")!.forEach((cb) => cb());
    el.click();
    expect([changes, clicks]).toEqual([1, 1]);
    ls.dispose();
    ls.dispose();
    el.click();
    expect(handlers.get("change:x")!.size).toBe(0);
    expect([clicks, extra]).toEqual([1, 1]);
  });
});

describe("lib/tokens: the one {id, token, p} table", () => {
  it("writes tokens as text (never HTML), the id as title and p as fmtPct", () => {
    const rows = tokenRows([{ id: 7, token: "<b>x</b>", p: 0.79 }, { id: 3, token: " Paris", p: 0.0001 }],
      { pClass: "pp", rowClass: (t) => (t.id === 3 ? "hit" : "") });
    expect(rows.map((r) => r.children[0].textContent)).toEqual(["<b>x</b>", " Paris"]);
    expect(rows[0].querySelector("b")).toBeNull();
    expect(rows.map((r) => r.children[0].getAttribute("title"))).toEqual(["#7", "#3"]);
    expect(rows.map((r) => r.children[1].textContent)).toEqual(["79%", "<0.1%"]);
    expect(rows.map((r) => r.getAttribute("class"))).toEqual([null, "hit"]);
    expect(rows[1].children[1].getAttribute("class")).toBe("pp");
  });
});
