// "Does this head matter?": the selected heads (click one, shift-click adds more) ablated in the
// kernel (the one ablation request of lib/ablation.ts, kind "heads"; nbdebug/widgets/attention.py →
// sessions/ablation.py): the Δ metric
// with its sign and colour, the ablated run's top-5 next tokens beside the clean ones, and the lens
// diff (per layer the clean and ablated top-1 token and the target's probability). A loading state
// while the kernel runs, an error line when it fails (e.g. the model was deleted: re-run the cell).
// Tokens are untrusted model text: textContent only.
import { fmtPct, h, replaceChildren } from "../lib/dom";
import { askAblation, headTargets, targetPairs, type AblationAnswer } from "../lib/ablation";
import type { AnyModel } from "../lib/rpc";
import { lensColumnTable } from "../lib/lenscolumn";
import { Latest } from "../lib/request";

export const ABLATE_CSS = `
.nbdebug-attention .nba-ablate { margin-top: 8px; border-top: 1px solid #ddd; padding-top: 6px; }
.nbdebug-attention .nba-ablate-title { font-weight: 600; }
.nbdebug-attention .nba-delta { font-weight: 700; font-family: ui-monospace, monospace; }
.nbdebug-attention .nba-delta.nba-up { color: #1d5c2e; }
.nbdebug-attention .nba-delta.nba-down { color: #b00; }
.nbdebug-attention .nba-ablate table { border-collapse: collapse; margin: 4px 12px 4px 0; font-size: 11px; }
.nbdebug-attention .nba-ablate th, .nbdebug-attention .nba-ablate td { padding: 1px 6px; text-align: left; white-space: pre; }
.nbdebug-attention .nba-ablate td.nba-tk, .nbdebug-attention .nba-ablate td.nba-lens-tok { font-family: ui-monospace, monospace; max-width: 160px; overflow: hidden; text-overflow: ellipsis; }
.nbdebug-attention .nba-ablate tr.nba-changed td { background: #fff4d6; }
.nbdebug-attention .nba-ablate th.nba-lens-row { font-weight: normal; }
.nbdebug-attention .nba-ablate-tables { display: flex; flex-wrap: wrap; align-items: flex-start; }
`;


/** A signed number: "+0.0123" / "−0.0123" (4 significant digits). */
export function signed(x: number): string {
  if (!Number.isFinite(x)) return String(x);
  const s = Math.abs(x) >= 1e-3 || x === 0 ? Math.abs(x).toPrecision(4) : Math.abs(x).toExponential(2);
  return (x > 0 ? "+" : x < 0 ? "−" : "±") + s;
}

const headsLabel = (heads: [number | string, number][]) => heads.map(([l, hd]) => `L${l}h${hd}`).join(" + ");

export class AblatePanel {
  readonly el = h("div", { class: "nba-ablate" });
  private status = h("div", { class: "nba-note nba-ablate-status" });
  private body = h("div", { class: "nba-ablate-body" });
  readonly latest = new Latest();

  constructor(private model: AnyModel, private heads: () => [number, number][]) {
    const note = String(model.get("ablate_note") || "");
    if (note) {
      replaceChildren(this.el, [h("div", { class: "nba-note nba-ablate-off", text: note })]);
      return;
    }
    const clear = h("button", { class: "nba-ablate-clear", text: "clear", title: "forget the ablation and the selected heads",
      on: { click: () => this.clear() } });
    replaceChildren(this.el, [
      h("div", {}, [h("span", { class: "nba-ablate-title", text: "ablation " }), clear]),
      this.status, this.body,
    ]);
    this.showSelection();
  }

  /** Whether the kernel can ablate here (no `ablate_note`). */
  get enabled(): boolean {
    return !this.model.get("ablate_note");
  }

  /** The selection changed: say what "ablate" would run on (the last answer stays until the next). */
  showSelection(): void {
    if (!this.enabled || this.el.getAttribute("data-state") === "loading") return;
    const sel = this.heads();
    if (!this.body.childNodes.length) {
      this.status.textContent = sel.length
        ? `ablate ${headsLabel(sel)} with the buttons above (shift-click a head to add it)`
        : "click a head, then ablate (zero | mean) to see what it changes; shift-click adds heads";
    }
  }

  clear(): void {
    this.latest.cancel();
    replaceChildren(this.body, []);
    this.el.removeAttribute("data-state");
    this.model.set("selected", []);
    this.model.save_changes();
    this.showSelection();
  }

  /** Ablate the selected heads in the kernel and show the answer. */
  async run(mode: "zero" | "mean"): Promise<void> {
    const heads = this.heads();
    if (!heads.length) return;
    const isLatest = this.latest.start();
    this.el.setAttribute("data-state", "loading");
    this.status.textContent = `ablating ${headsLabel(heads)} (${mode})…`;
    this.status.classList.remove("nba-error");
    try {
      const ans = await askAblation(this.model, { kind: "heads", targets: headTargets(heads), mode });
      if (!isLatest()) return;
      this.show(ans.result);
    } catch (err) {
      if (!isLatest()) return;
      this.el.setAttribute("data-state", "error");
      this.status.classList.add("nba-error");
      this.status.textContent = String(err instanceof Error ? err.message : err);
    }
  }

  private show(a: AblationAnswer): void {
    const m = a.metric;
    const d = m.delta;
    const delta = h("span", { class: ["nba-delta", d > 0 ? "nba-up" : d < 0 ? "nba-down" : ""], text: `Δ ${signed(d)}`,
      attrs: { "data-value": String(d) } });
    this.status.textContent = "";
    replaceChildren(this.status, [
      `${headsLabel(targetPairs(a.targets))} ${a.mode}-ablated: ${m.label} `, delta,
      ` (clean ${m.clean.toPrecision(4)} → ${m.ablated.toPrecision(4)}; ${(a.seconds * 1000).toFixed(0)} ms)`,
    ]);
    const tops = a.top ?? { clean: [], ablated: [] };
    const top = h("table", { class: "nba-ablate-top" }, [
      h("tr", {}, [h("th", { text: "#" }), h("th", { text: "clean" }), h("th", { text: "" }), h("th", { text: "ablated" }), h("th", { text: "" })]),
      ...Array.from({ length: Math.max(tops.clean.length, tops.ablated.length) }, (_, i) => {
        const c = tops.clean[i];
        const x = tops.ablated[i];
        return h("tr", { class: c && x && c.id !== x.id ? "nba-changed" : "" }, [
          h("td", { text: String(i + 1) }),
          h("td", { class: "nba-tk", text: c ? c.label : "" }), h("td", { text: c ? fmtPct(c.p) : "" }),
          h("td", { class: "nba-tk", text: x ? x.label : "" }), h("td", { text: x ? fmtPct(x.p) : "" }),
        ]);
      }),
    ]);
    const lens = lensColumnTable([{ name: "clean", entries: a.lens?.clean }, { name: "ablated", entries: a.lens?.ablated }], {
      prefix: "nba", rowHeader: "lens (last position)", answer: m.of?.label ?? "", markChanged: true, cls: "nba-ablate-lens",
      rowTitle: (name, i, n) => (i === 0 ? "the embeddings" : i === n - 1 ? "the model's output" : `after ${name}`),
    });
    replaceChildren(this.body, [h("div", { class: "nba-ablate-tables" }, [top, lens])]);
    this.el.setAttribute("data-state", "done");
  }
}
