// @vitest-environment happy-dom
import { describe, expect, it } from "vitest";
import { fmt, fmtInt, fmtPct, h, withCode } from "../src/lib/dom";
import { isOwnKey } from "../src/lib/keys";

describe("fmt", () => {
  it("uses 3 significant digits", () => {
    expect(fmt(0)).toBe("0");
    expect(fmt(1)).toBe("1");
    expect(fmt(1.5)).toBe("1.5");
    expect(fmt(3.14159)).toBe("3.14");
    expect(fmt(-0.012345)).toBe("-0.0123");
    expect(fmt(123.456)).toBe("123");
    expect(fmt(9.999)).toBe("10");
    expect(fmt(12345)).toBe("12300");
  });
  it("switches to exponents for tiny and huge values", () => {
    expect(fmt(1.234e-5)).toBe("1.23e-5");
    expect(fmt(-2e-7)).toBe("-2e-7");
    expect(fmt(123456)).toBe("1.23e5");
    expect(fmt(99999)).toBe("1e5");
    expect(fmt(3.4e38)).toBe("3.4e38");
  });
  it("names non-finite values", () => {
    expect(fmt(NaN)).toBe("NaN");
    expect(fmt(Infinity)).toBe("∞");
    expect(fmt(-Infinity)).toBe("-∞");
    expect(fmt(undefined)).toBe("NaN");
  });
  it("formats integers and percentages", () => {
    expect(fmtInt(8192)).toBe("8,192");
    expect(fmtPct(0)).toBe("0%");
    expect(fmtPct(0.5)).toBe("50%");
    expect(fmtPct(0.0123)).toBe("1.2%");
    expect(fmtPct(0.00001)).toBe("<0.1%");
    expect(fmtPct(0.996)).toBe("99.6%");
    expect(fmtPct(1)).toBe("100%");
  });
});

describe("notebook shortcuts and our keys", () => {
  it("marks focusable elements and suppresses the notebook's shortcuts only for our own plain keys, during that event", async () => {
    const row = h("div", { attrs: { tabindex: 0 } });
    const plain = h("div");
    const btn = h("button");
    document.body.append(row, plain, btn);
    expect(row.hasAttribute("data-nbd-keys")).toBe(true);
    expect(btn.hasAttribute("data-nbd-keys")).toBe(true);
    expect(plain.hasAttribute("data-nbd-keys")).toBe(false);
    expect(row.hasAttribute("data-lm-suppress-shortcuts")).toBe(false); // never static
    const seen: (string | null)[] = [];
    const probe = (ev: Event) => seen.push((ev.target as Element).getAttribute("data-lm-suppress-shortcuts"));
    document.addEventListener("keydown", probe, true); // where lumino listens (Notebook 7: capture phase)
    const press = (el: Element, init: KeyboardEventInit) => el.dispatchEvent(new KeyboardEvent("keydown", { bubbles: true, ...init }));
    press(row, { key: "ArrowDown" });
    press(row, { key: "Enter", shiftKey: true }); // Shift+Enter runs the cell: the notebook's
    press(row, { key: "s", ctrlKey: true }); // save: the notebook's
    press(row, { key: "Escape" });
    press(plain, { key: "ArrowDown" });
    press(btn, { key: " " });
    document.removeEventListener("keydown", probe, true);
    expect(seen).toEqual(["true", null, null, null, null, "true"]);
    await new Promise((r) => setTimeout(r, 0));
    expect(row.hasAttribute("data-lm-suppress-shortcuts")).toBe(false);
    expect(isOwnKey(row, { key: "ArrowUp", ctrlKey: false, metaKey: false, altKey: false, shiftKey: false })).toBe(true);
    expect(isOwnKey(row, { key: "a", ctrlKey: false, metaKey: false, altKey: false, shiftKey: false })).toBe(false);
  });
});

describe("withCode", () => {
  it("writes backticked names as code spans and everything as text nodes", () => {
    const el = h("div", {}, withCode("`lr=3.0` spikes; `<img src=x>` ends"));
    expect(el.textContent).toBe("lr=3.0 spikes; <img src=x> ends");
    expect(Array.from(el.querySelectorAll("code")).map((c) => c.textContent)).toEqual(["lr=3.0", "<img src=x>"]);
    expect(el.querySelector("img")).toBeNull();
    expect(withCode("")).toEqual([]);
    expect(withCode(null)).toEqual([]);
  });
});
