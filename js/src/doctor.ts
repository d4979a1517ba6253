// The doctor's checklist (nbdebug/widgets/doctor.py, DoctorWidget): one row per check with its
// status, evidence numbers and advice, the failed checks first under a prominent "N failed"; the
// overfit_batch row draws the loss per step on a canvas with the "near zero" target and, for
// classification, the double-softmax floor. Clicking a row sets the synced `selected` trait. All
// text goes through textContent (advice and evidence may quote layer names) and wraps: nothing is
// cut in a narrow notebook; every text colour keeps WCAG AA contrast on its background.
import { codeCss, fmt, h, replaceChildren, styleElement, withCode } from "./lib/dom";
import { typedArray } from "./lib/ndarray";
import type { AnyModel } from "./lib/rpc";
import { Listeners } from "./lib/request";

export interface Check {
  name: string;
  status: "pass" | "warn" | "fail" | "skip";
  advice: string;
  evidence: [string, unknown][];
}

const MARK: Record<string, string> = { pass: "✓", warn: "!", fail: "✗", skip: "–" };

const CSS = `
.nbdebug-doctor { font: 12px/1.4 var(--jp-ui-font-family, system-ui, sans-serif); color: var(--jp-ui-font-color1, #222);
  --nbd-d-fg2: color-mix(in srgb, var(--jp-ui-font-color1, #222) 80%, transparent); max-width: 100%; }
.nbdebug-doctor .nbd-head { margin-bottom: 6px; display: flex; flex-wrap: wrap; gap: 4px 10px; align-items: baseline; }
.nbdebug-doctor .nbd-verdict { font-weight: 700; font-size: 1.15em; padding: 1px 8px; border-radius: 4px; color: #fff; background: #b71c1c; }
.nbdebug-doctor .nbd-verdict.nbd-ok { background: #1b5e20; }
.nbdebug-doctor .nbd-headline { flex-basis: 100%; font-weight: 600; overflow-wrap: anywhere; }
.nbdebug-doctor .nbd-check { display: grid; grid-template-columns: 18px minmax(0, 150px) minmax(0, 1fr); gap: 2px 8px; padding: 4px 6px; border-left: 3px solid transparent; cursor: pointer; }
.nbdebug-doctor .nbd-check:hover { background: var(--jp-layout-color2, #f3f3f3); }
.nbdebug-doctor .nbd-check.nbd-selected { background: color-mix(in srgb, var(--jp-brand-color1, #1976d2) 12%, transparent); outline: 1px solid var(--jp-brand-color1, #1976d2); outline-offset: -1px; }
.nbdebug-doctor .nbd-check[data-status="pass"] { border-left-color: #1b5e20; }
.nbdebug-doctor .nbd-check[data-status="fail"] { border-left-color: #b71c1c; }
.nbdebug-doctor .nbd-check[data-status="warn"] { border-left-color: #8a4b00; }
.nbdebug-doctor .nbd-check[data-status="skip"] { border-left-color: #9e9e9e; }
.nbdebug-doctor .nbd-status { font-weight: bold; }
.nbdebug-doctor [data-status="pass"] .nbd-status { color: #1b5e20; }
.nbdebug-doctor [data-status="fail"] .nbd-status { color: #b71c1c; }
.nbdebug-doctor [data-status="warn"] .nbd-status { color: #8a4b00; }
.nbdebug-doctor .nbd-look { color: #8a4b00; font-weight: 600; }
.nbdebug-doctor [data-status="skip"] .nbd-status { color: #424242; }
.nbdebug-doctor .nbd-name { font-family: var(--jp-code-font-family, monospace); overflow-wrap: anywhere; }
.nbdebug-doctor [data-status="fail"] .nbd-name { font-weight: 700; }
.nbdebug-doctor .nbd-evidence { color: var(--nbd-d-fg2); font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
.nbdebug-doctor .nbd-evidence span { margin-right: 10px; display: inline-block; max-width: 100%; }
.nbdebug-doctor .nbd-advice, .nbdebug-doctor .nbd-plot { grid-column: 2 / 4; overflow-wrap: anywhere; min-width: 0; }
.nbdebug-doctor [data-status="pass"] .nbd-advice, .nbdebug-doctor [data-status="skip"] .nbd-advice { color: var(--nbd-d-fg2); }
.nbdebug-doctor canvas.nbd-curve { border: 1px solid var(--jp-border-color2, #ddd); display: block; max-width: 100%; }
.nbdebug-doctor .nbd-legend { font-size: 10px; color: var(--nbd-d-fg2); }
.nbdebug-doctor .nbd-notes { margin: 4px 0 0 18px; padding: 0; color: var(--nbd-d-fg2); overflow-wrap: anywhere; }
`;

/** The checks as listed: failed first, then those worth a look ("warn"), then the others, each in checklist order. */
export function failedFirst(checks: Check[]): Check[] {
  const rank = (c: Check) => (c.status === "fail" ? 0 : c.status === "warn" ? 1 : 2);
  return [...checks].sort((a, b) => rank(a) - rank(b));
}

/** One evidence value as text: numbers with 3 significant digits, lists comma-separated. */
export function evidenceText(v: unknown): string {
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : fmt(v);
  if (Array.isArray(v)) return v.map(evidenceText).join(", ");
  if (typeof v === "boolean") return v ? "yes" : "no";
  return v === null || v === undefined ? "" : String(v);
}

/** The overfit loss per step from the `curve` bytes trait (a DataView in Jupyter). */
export function curveOf(model: AnyModel): Float32Array {
  const raw = model.get("curve");
  if (!raw || !(raw.byteLength > 0)) return new Float32Array(0);
  return typedArray(raw, "float32") as Float32Array;
}

/** Draw `curve` (linear y from 0 to its max) with dashed horizontal lines; returns the pixels drawn. */
export function drawCurve(canvas: HTMLCanvasElement, curve: Float32Array, lines: { y: number; colour: string }[]): number {
  const ctx = canvas.getContext("2d");
  if (!ctx || curve.length === 0) return 0;
  const w = canvas.width;
  const ht = canvas.height;
  let hi = 0;
  for (const v of curve) if (Number.isFinite(v) && v > hi) hi = v;
  for (const l of lines) if (Number.isFinite(l.y) && l.y > hi) hi = l.y;
  if (!(hi > 0)) hi = 1;
  const x = (i: number) => (curve.length > 1 ? (i / (curve.length - 1)) * (w - 4) + 2 : w / 2);
  const y = (v: number) => ht - 2 - (Math.max(v, 0) / hi) * (ht - 4);
  ctx.clearRect(0, 0, w, ht);
  ctx.setLineDash([4, 3]);
  ctx.lineWidth = 1;
  for (const l of lines) {
    if (!Number.isFinite(l.y)) continue;
    ctx.strokeStyle = l.colour;
    ctx.beginPath();
    ctx.moveTo(0, y(l.y));
    ctx.lineTo(w, y(l.y));
    ctx.stroke();
  }
  ctx.setLineDash([]);
  ctx.strokeStyle = "#1976d2";
  ctx.lineWidth = 2;
  ctx.beginPath();
  let pen = false;
  let drawn = 0;
  curve.forEach((v, i) => {
    if (!Number.isFinite(v)) {
      pen = false;
      return;
    }
    if (pen) ctx.lineTo(x(i), y(v));
    else ctx.moveTo(x(i), y(v));
    pen = true;
    drawn++;
  });
  if (curve.length === 1 && drawn) ctx.lineTo(x(0) + 1, y(curve[0]));
  ctx.stroke();
  return drawn;
}

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const root = h("div", { class: "nbdebug-doctor" });
  const head = h("div", { class: "nbd-head" });
  const list = h("div", { class: "nbd-checks" });
  const notes = h("ul", { class: "nbd-notes" });
  root.append(styleElement(CSS + codeCss(".nbdebug-doctor")), head, list, notes);
  el.appendChild(root);

  const num = (name: string): number => {
    const v = model.get(name);
    return typeof v === "number" ? v : NaN;
  };

  const plot = (): HTMLElement => {
    const curve = curveOf(model);
    const canvas = h("canvas", { class: "nbd-curve", attrs: { width: 260, height: 70 } });
    const target = num("curve_target");
    const floor = num("curve_floor");
    const drawn = drawCurve(canvas, curve, [
      { y: target, colour: "#2e7d32" },
      { y: floor, colour: "#c62828" },
    ]);
    canvas.setAttribute("data-points", String(drawn));
    const legend = h("div", { class: "nbd-legend" }, [
      `loss per step (${curve.length} points)`,
      Number.isFinite(target) ? ` · green: target ${fmt(target)}` : "",
      Number.isFinite(floor) ? ` · red: double-softmax floor ${fmt(floor)}` : "",
    ]);
    return h("div", { class: "nbd-plot" }, [canvas, legend]);
  };

  const draw = () => {
    const checks: Check[] = model.get("checks") ?? [];
    const failed = checks.filter((c) => c.status === "fail").length;
    const look = checks.filter((c) => c.status === "warn").length;
    const classes = model.get("classes");
    replaceChildren(head, [
      h("span", { class: ["nbd-verdict", !failed && "nbd-ok"], text: failed ? `${failed} failed` : "nothing failed" }),
      ...(look ? [h("span", { class: "nbd-look", text: `${look} worth a look` })] : []),
      h("span", { text: `of ${checks.length} checks · nbdebug doctor · ${model.get("kind") ?? ""}${classes ? `, ${classes} classes` : ""} · ${fmt(num("elapsed_s"))} s` }),
      ...(failed && model.get("headline") ? [h("div", { class: "nbd-headline" }, withCode(String(model.get("headline"))))] : []),
    ]);
    const selected = model.get("selected") ?? "";
    replaceChildren(
      list,
      failedFirst(checks).map((c) => {
        const ev = h("div", { class: "nbd-evidence" }, c.evidence.map(([k, v]) => h("span", { text: `${k} = ${evidenceText(v)}` })));
        const row = h(
          "div",
          {
            class: ["nbd-check", c.name === selected && "nbd-selected"],
            data: { check: c.name, status: c.status },
            on: {
              click: () => {
                model.set("selected", c.name === model.get("selected") ? "" : c.name);
                model.save_changes();
              },
            },
          },
          [
            h("span", { class: "nbd-status", text: MARK[c.status] ?? "?", title: c.status }),
            h("span", { class: "nbd-name", text: c.name }),
            ev,
            h("div", { class: "nbd-advice", text: c.advice }),
          ],
        );
        if (c.name === "overfit_batch" && curveOf(model).length) row.appendChild(plot());
        return row;
      }),
    );
    replaceChildren(notes, (model.get("notes") ?? []).map((n: string) => h("li", { text: n })));
    root.setAttribute("data-ready", "1");
  };

  const onChange = () => draw();
  const events = "change:checks change:curve change:curve_target change:curve_floor change:selected change:notes change:headline";
  const listeners = new Listeners(); // every model listener, removed by one dispose()
  listeners.model(model, events, onChange);
  try {
    draw();
  } catch (err) {
    root.appendChild(h("div", { class: "nbd-error", text: String(err) }));
    model.set("js_error", String(err));
    model.save_changes();
    root.setAttribute("data-ready", "1");
  }
  return () => {
    listeners.dispose();
    root.remove();
  };
}

export default { render };
