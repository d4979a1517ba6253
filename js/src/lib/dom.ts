import { ownKeys } from "./keys";

// Element helpers for the views. Model text (layer names, tokens, class names) is untrusted, so
// everything here goes through `textContent` and `setAttribute` only, never HTML parsing of strings.
//
//   h("div", { class: "row", on: { click: () => pick(i) } }, [h("span", { text: name }), "plain text"])

export type Child = Node | string | number | null | undefined | false;

export interface HOptions {
  /** Class names: a string ("a b") or a list (falsy entries skipped). */
  class?: string | (string | false | null | undefined)[];
  /** Inline styles; keys are CSS property names ("background-color" or "--my-var"). */
  style?: Record<string, string | number | null | undefined>;
  /** Attributes set with setAttribute (null/undefined/false skipped, true → ""). */
  attrs?: Record<string, string | number | boolean | null | undefined>;
  /** data-* attributes (keys without the "data-" prefix). */
  data?: Record<string, string | number>;
  /** Text content (set with textContent; children are appended after it). */
  text?: string | number;
  /** Tooltip (the title attribute). */
  title?: string;
  /** Event listeners. */
  on?: Record<string, (ev: any) => void>;
}

const FOCUSABLE = new Set(["input", "select", "textarea", "button"]);

/** Create an element; never parses HTML. Focusable ones (form controls, a `tabindex`) keep their
 * navigation keys from the notebook's shortcuts (see {@link ownKeys}). */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  opts?: HOptions,
  children?: Child[],
): HTMLElementTagNameMap[K];
export function h(tag: string, opts?: HOptions, children?: Child[]): HTMLElement;
export function h(tag: string, opts: HOptions = {}, children: Child[] = []): HTMLElement {
  const el = document.createElement(tag);
  if (opts.class) {
    const cls = Array.isArray(opts.class) ? opts.class.filter(Boolean).join(" ") : opts.class;
    if (cls) el.setAttribute("class", cls);
  }
  if (opts.style) setStyle(el, opts.style);
  if (opts.attrs) {
    for (const [k, v] of Object.entries(opts.attrs)) {
      if (v === null || v === undefined || v === false) continue;
      el.setAttribute(k, v === true ? "" : String(v));
    }
  }
  if (opts.data) for (const [k, v] of Object.entries(opts.data)) el.setAttribute(`data-${k}`, String(v));
  if (FOCUSABLE.has(tag) || el.hasAttribute("tabindex")) ownKeys(el);
  if (opts.title !== undefined) el.setAttribute("title", opts.title);
  if (opts.text !== undefined) el.textContent = String(opts.text);
  if (opts.on) for (const [ev, fn] of Object.entries(opts.on)) el.addEventListener(ev, fn);
  append(el, children);
  return el;
}

/** Append children (strings become text nodes; null/undefined/false are skipped). */
export function append(el: Node, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
}

/** Set inline styles (null/undefined removes the property). */
export function setStyle(el: HTMLElement, style: Record<string, string | number | null | undefined>): void {
  for (const [k, v] of Object.entries(style)) {
    if (v === null || v === undefined) el.style.removeProperty(k);
    else el.style.setProperty(k, String(v));
  }
}

/** Remove every child of `el`. */
export function clear(el: Node): void {
  while (el.firstChild) el.removeChild(el.firstChild);
}

/** Replace the children of `el`. */
export function replaceChildren(el: Node, children: Child[]): void {
  clear(el);
  append(el, children);
}

/** A <style> element whose content is `css` (set as textContent). */
export function styleElement(css: string): HTMLStyleElement {
  const s = document.createElement("style");
  s.textContent = css;
  return s;
}

/**
 * Format a number for display: 3 significant digits, exponent notation for tiny/huge values,
 * "NaN", "∞", "-∞". Trailing zeros are trimmed (1.50 → "1.5").
 */
export function fmt(x: number | null | undefined, digits = 3): string {
  if (x === null || x === undefined || Number.isNaN(x)) return "NaN";
  if (x === Infinity) return "∞";
  if (x === -Infinity) return "-∞";
  if (x === 0) return "0";
  // Round to `digits` significant digits first (so 9.999 → 10, not 10.0).
  const r = Number(x.toPrecision(digits));
  const ar = Math.abs(r);
  if (ar >= 1e-3 && ar < 1e5) {
    const mag = Math.floor(Math.log10(Math.abs(r)));
    const decimals = Math.max(0, digits - 1 - mag);
    return trimZeros(r.toFixed(decimals));
  }
  const [m, e] = x.toExponential(digits - 1).split("e");
  return `${trimZeros(m)}e${e.startsWith("+") ? e.slice(1) : e}`;
}

function trimZeros(s: string): string {
  return s.includes(".") ? s.replace(/\.?0+$/, "") : s;
}

/** Integer with thousands separators ("8,192"); non-finite as in `fmt`. */
export function fmtInt(x: number): string {
  if (!Number.isFinite(x)) return fmt(x);
  return Math.round(x).toLocaleString("en-US");
}

/** Text with `code` spans for backticked names, as text nodes only: the one way a headline, a
 * finding or a note marks a module, layer or run name (Python's static pages: widgets/_snapshot.py
 * code_html). */
export function withCode(text: string | null | undefined): Child[] {
  return String(text ?? "")
    .split("`")
    .map((part, i) => (i % 2 === 1 ? h("code", { text: part }) : part))
    .filter((c) => c !== "");
}

/** CSS of the code spans `withCode` makes, under `scope` (a view's root class): a name reads as a name. */
export function codeCss(scope: string): string {
  return `${scope} code { font-family: var(--jp-code-font-family, ui-monospace, Menlo, Consolas, monospace); ` +
    "background: rgba(127,127,127,0.12); border: 1px solid rgba(127,127,127,0.3); border-radius: 3px; padding: 0 3px; }\n";
}

/** Fraction as a percentage ("12.5%", "<0.1%" for tiny non-zero values, "100%"). */
export function fmtPct(frac: number): string {
  if (!Number.isFinite(frac)) return fmt(frac);
  const p = frac * 100;
  if (p === 0) return "0%";
  if (Math.abs(p) < 0.1) return "<0.1%";
  if (Math.abs(p) >= 99.95 && Math.abs(p) < 100) return ">99.9%";
  const a = Math.abs(p);
  return `${Number(p.toFixed(a >= 10 && a < 99.5 ? 0 : 1))}%`;
}
