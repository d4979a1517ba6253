// What the thermometer's header (summary), notes and diagnoses say at the step slider's position.
// The kernel's texts describe one step (`report_step`, the last kept step) and the whole run
// (`run_texts`); at any other kept step they are decided here from the flags and values of that
// step already in the browser (no request: the kernel may be busy), and say so.
import { fmt, fmtPct, h, replaceChildren } from "../lib/dom";
import { Said, withCode } from "./cards";
import { chip, displayFlags, flagColor, type Diagnosis, type Layer, type Legend, type StatTable } from "./rows";

export interface Texts {
  summary: string;
  notes: string[];
  diagnoses: Diagnosis[];
}

/** Where the table is: a kept step, or the whole run (`total` steps merged). */
export interface At {
  whole: boolean;
  step: number;
  total: number;
}

/** The kernel's note naming the step of the table ("table and flags at step 40 of 40 (…)"). */
const STEP_NOTE = /^table and flags at step \d+ of /;
/** Severity of a flag's line (the kernel's Diagnosis severities). */
const ERRORS = new Set(["raised", "nonfinite", "nan_origin_fwd", "nan_origin_bwd"]);
const WARNINGS = new Set(["dead", "exploding"]);
/** Codes in the order their lines are listed (unknown codes after, in order of appearance). */
const ORDER = ["raised", "nan_origin_fwd", "nan_origin_bwd", "nonfinite", "exploding", "dead", "vanishing", "saturated", "dead_units", "update_high", "update_low", "update_ratio"];

const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? "" : "s"}`; // as the kernel says it (steps.py plural)

/** A row's value behind flag `code` at this position ("" when the table lacks it). */
function valueOf(stats: StatTable, i: number, code: string): string {
  const v = (c: string) => stats.get(i, c);
  const ok = (x: number) => Number.isFinite(x);
  switch (code) {
    case "dead":
      return ok(v("zero_frac")) ? `zeros ${fmtPct(v("zero_frac"))}` : "";
    case "dead_units":
      return ok(v("dead_unit_frac")) ? `dead units ${fmtPct(v("dead_unit_frac"))}` : "";
    case "saturated":
      return ok(v("saturated_frac")) ? `saturated ${fmtPct(v("saturated_frac"))}` : "";
    case "nonfinite":
    case "nan_origin_fwd":
      return ok(v("nan")) || ok(v("inf")) ? `NaN ${fmt(v("nan") || 0)}, Inf ${fmt(v("inf") || 0)}` : "";
    case "nan_origin_bwd":
      return ok(v("grad_nan")) || ok(v("grad_inf")) ? `∇NaN ${fmt(v("grad_nan") || 0)}, ∇Inf ${fmt(v("grad_inf") || 0)}` : "";
    case "exploding":
    case "vanishing":
      return ok(v("grad_norm")) ? `‖∂L/∂out‖ ${fmt(v("grad_norm"))}` : "";
    case "update_ratio":
    case "update_high":
    case "update_low":
      return ok(v("update_ratio")) ? `update ratio ${fmt(v("update_ratio"))}` : "";
    default:
      return "";
  }
}

/** A row's flags as shown (update ratio: too high / too low). */
const shown = (l: Layer, i: number, stats: StatTable, legend: Legend) => displayFlags((l.flags ?? []).map(String), stats.get(i, "update_ratio"), legend);

/** Rows per flag code, codes in ORDER (then in order of appearance). */
function byCode(layers: Layer[], stats: StatTable, legend: Legend): [string, number[]][] {
  const rows = new Map<string, number[]>();
  layers.forEach((l, i) => {
    for (const c of shown(l, i, stats, legend)) {
      const code = String(c);
      if (!rows.has(code)) rows.set(code, []);
      rows.get(code)!.push(i);
    }
  });
  const rank = (c: string) => (ORDER.includes(c) ? ORDER.indexOf(c) : ORDER.length);
  return [...rows.entries()].sort((a, b) => rank(a[0]) - rank(b[0]));
}

const label = (legend: Legend, code: string) => legend[code]?.label || code;

/** The header, notes and diagnoses decided in the browser from `layers`' flags and `stats` at `at`. */
export function browserTexts(at: At, layers: Layer[], stats: StatTable, legend: Legend, kernel: Texts): Texts {
  const where = at.whole ? `over the whole run (${plural(at.total, "step")} merged)` : `at step ${at.step}`;
  const head = at.whole ? `whole run (${plural(at.total, "step")} merged)` : `step ${at.step}`;
  const codes = byCode(layers, stats, legend);
  const parts = codes.map(([code, rows]) => `${label(legend, code)} in ${plural(rows.length, "layer")}`);
  const summary = `${head}: ${plural(layers.length, "layer")}: ${parts.length ? parts.join(", ") : "no flags"}`;
  const diagnoses: Diagnosis[] = kernel.diagnoses.filter((d) => d.code === "raised"); // the cell's end, any step
  for (const [code, rows] of codes) {
    if (code === "raised") continue;
    const shown = rows.slice(0, 3).map((i) => {
      const v = valueOf(stats, i, code);
      return `\`${String(layers[i].name)}\`${v ? ` (${v})` : ""}`;
    });
    const more = rows.length > 3 ? `, and ${rows.length - 3} more` : "";
    diagnoses.push({
      code,
      severity: ERRORS.has(code) ? "error" : WARNINGS.has(code) ? "warning" : "info",
      layer: String(layers[rows[0]].name),
      message: `${label(legend, code)} ${where} in ${plural(rows.length, "layer")}: ${shown.join(", ")}${more}.`,
      suggestion: legend[code]?.description ?? "",
    });
  }
  const said = at.whole
    ? "table and flags over the whole run (the merged rows)"
    : `table and flags at step ${at.step} of ${at.total}`;
  const how = "; the header and diagnoses are this position's flags, decided in the browser" +
    (at.whole ? "" : ` (diagnose(result, step=${at.step}) gives the kernel's full report of this step)`);
  let replaced = false;
  const notes = kernel.notes.map((n) => {
    if (!STEP_NOTE.test(n)) return n;
    replaced = true;
    return at.whole ? said + how : n.replace(STEP_NOTE, `table and flags at step ${at.step} of `) + how;
  });
  if (!replaced) notes.push(said + how);
  return { summary, notes, diagnoses };
}

/**
 * The texts at `at`: the kernel's own at its report's step (`reportStep`) and over the whole run
 * (`run`, when it sent them), else {@link browserTexts}.
 */
export function textsAt(at: At | null, reportStep: number, kernel: Texts, run: Partial<Texts> | null, layers: Layer[], stats: StatTable, legend: Legend): Texts {
  if (!at) return kernel;
  if (at.whole) {
    if (run && typeof run.summary === "string") return { summary: run.summary, notes: run.notes ?? [], diagnoses: run.diagnoses ?? [] };
    return browserTexts(at, layers, stats, legend, kernel);
  }
  if (reportStep > 0 && at.step === reportStep) return kernel;
  return browserTexts(at, layers, stats, legend, kernel);
}

/** The flag legend; codes absent from the rows at this position are hidden (class nbd-absent). */
export function drawLegend(box: HTMLElement, legend: Legend, layers: Layer[], diags: Diagnosis[], stats?: StatTable): void {
  const present = new Set(layers.flatMap((l, i) => (stats ? shown(l, i, stats, legend) : (l.flags ?? []).map(String))));
  for (const d of diags) if (d.code !== "update_ratio" || !legend.update_high) present.add(d.code);
  replaceChildren(
    box,
    Object.entries(legend).map(([code, e]) =>
      h("span", { class: ["nbd-legend-item", !present.has(code) && "nbd-absent"], title: e.description ?? code, data: { code } }, [
        h("span", { class: "nbd-swatch", style: { background: flagColor(legend, code) } }),
        e.label || code,
      ]),
    ),
  );
}

/** The diagnose code's chip: an update-ratio one says too high or too low (from its message). */
function chipCode(d: Diagnosis, legend: Legend): string {
  if (d.code !== "update_ratio" || !legend.update_high) return d.code;
  return /too low|below/.test(d.message) ? "update_low" : "update_high";
}

/** The diagnoses list (model text as text nodes; a layer name links to its row via data-layer, as a
 * name in code style); a suggestion already said above is left out (`said`). */
export function drawDiagnoses(list: HTMLElement, legend: Legend, diags: Diagnosis[], said: Said = new Said()): void {
  replaceChildren(
    list,
    diags.map((d) =>
      h("li", { class: `nbd-sev-${d.severity}`, style: { "--nbd-chip": flagColor(legend, chipCode(d, legend)) } }, [
        h("div", {}, [
          h("span", { class: "nbd-sev", text: d.severity }),
          chip(legend, chipCode(d, legend)),
          d.layer ? h("code", { class: "nbd-link", text: d.layer, data: { layer: d.layer }, title: "show this layer" }) : null,
          d.layer ? " — " : null,
          ...withCode(d.message),
        ]),
        said.advice(d.suggestion),
      ]),
    ),
  );
}
