// Row ablation of the thermometer (issue 20): the selected row's module → "ablate" asks the kernel
// (the one ablation request of lib/ablation.ts, kind "modules"; nbdebug/widgets/thermometer.py) to re-run the last step's forward with that module's
// output zeroed (or mean-replaced) and shows Δ loss, or, when the loss cannot be recomputed, Δ of the
// output (mean |Δ logits|, top-1 agreement) with the kernel's one-line note. Names are model text:
// textContent only.
import { fmt, h, replaceChildren } from "../lib/dom";
import { askAblation, type AblationAnswer } from "../lib/ablation";
import type { AnyModel } from "../lib/rpc";
import { Latest } from "../lib/request";

export const ABLATE_CSS = `
.nbdebug-thermometer .nbd-row-ablate { margin: 4px 0; font-size: 12px; }
.nbdebug-thermometer .nbd-row-ablate button, .nbdebug-thermometer .nbd-row-ablate select { margin-left: 4px; }
.nbdebug-thermometer .nbd-row-ablate .nbd-delta { font-weight: bold; margin-left: 6px; }
.nbdebug-thermometer .nbd-row-ablate .nbd-ablate-note { color: #666; }
`;

const signed = (x: number) => `${x > 0 ? "+" : x < 0 ? "−" : "±"}${fmt(Math.abs(x))}`;

/** The answer in one line: "Δ loss = +0.12 (1.03 → 1.15)" or "mean |Δ logits| = 0.3, top-1 agrees on 80%". */
export function rowAblationText(r: AblationAnswer): string {
  const m = r.metric;
  if (m.kind === "loss") return `Δ loss = ${signed(m.delta)} (${fmt(m.clean)} → ${fmt(m.ablated)})`;
  const agree = r.agreement === undefined || r.agreement === null || !Number.isFinite(r.agreement) ? "" : `, top-1 agrees on ${Math.round(r.agreement * 100)}%`;
  return `mean |Δ logits| = ${fmt(m.delta)}${agree}`;
}

/** "ablate <row>'s output [zero|mean] [ablate]" under the table, for the selected row. */
export class AblateRow {
  readonly el: HTMLElement;
  private name = "";
  readonly latest = new Latest();
  private readonly label = h("span", { class: "nbd-ablate-row" });
  private readonly mode = h("select", { class: "nbd-ablate-mode" }, [
    h("option", { attrs: { value: "zero" }, text: "zero" }),
    h("option", { attrs: { value: "mean" }, text: "mean" }),
  ]) as HTMLSelectElement;
  private readonly out = h("span", { class: "nbd-ablate-out" });

  constructor(private readonly model: AnyModel) {
    const go = h("button", { class: "nbd-ablate-go", text: "ablate", title: "re-run the last step's forward with this module's output ablated", on: { click: () => void this.run() } });
    this.el = h("div", { class: "nbd-row-ablate" }, [h("span", { text: "ablate " }), this.label, h("span", { text: "'s output" }), this.mode, go, this.out]);
    this.show("");
  }

  /** The selected row changed (""  hides the panel); a new row forgets the last answer. */
  show(name: string): void {
    const on = Boolean(this.model.get("can_ablate")) && name !== "";
    this.el.style.display = on ? "" : "none";
    if (name === this.name) return;
    this.name = name;
    this.latest.cancel();
    this.label.textContent = name;
    replaceChildren(this.out, []);
    this.el.removeAttribute("data-delta");
  }

  async run(): Promise<void> {
    if (!this.name) return;
    const isLatest = this.latest.start();
    replaceChildren(this.out, [h("span", { text: " re-running…" })]);
    try {
      const answer = await askAblation(this.model, { kind: "modules", targets: [{ layer: this.name, units: [] }], mode: this.mode.value });
      if (!isLatest()) return;
      const r = answer.result;
      replaceChildren(this.out, [
        h("span", { class: "nbd-delta", text: rowAblationText(r) }),
        r.note ? h("div", { class: "nbd-ablate-note", text: r.note }) : null,
      ]);
      this.el.setAttribute("data-delta", String(r.metric.delta));
    } catch (err) {
      if (!isLatest()) return;
      replaceChildren(this.out, [h("span", { class: "nbd-error", text: ` ${err instanceof Error ? err.message : String(err)}` })]);
    }
  }
}
