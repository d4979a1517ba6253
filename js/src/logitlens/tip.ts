// The hover tip: over a cell, its top-k with whole tokens, entropy, KL and the target's rank; over a
// column header, the whole token of that position (headers and cells truncate long tokens).
// Kept inside the widget's width, so a narrow notebook does not cut it off.
import { fmt, fmtPct, h } from "../lib/dom";
import { fmtValue, type Columns } from "./columns";
import type { LensText } from "./table";

export class LensTip {
  readonly el = h("div", { class: "nbl-tip", style: { display: "none" } });

  constructor(private root: HTMLElement, private x: LensText, private cols: Columns) {}

  private lines(target: HTMLElement): string[] | null {
    const { x, cols } = this;
    const k = cols.k;
    const th = target.closest?.("th[data-pos]") as HTMLElement | null;
    if (th) {
      const p = Number(th.getAttribute("data-pos"));
      return [`position ${p}: ${x.tokens[p] ?? ""}`, `raw token: ${x.raw[p] ?? ""}${x.generated[p] ? " (generated)" : ""}`];
    }
    const td = target.closest?.("td[data-row]") as HTMLElement | null;
    if (!td) return null;
    const r = Number(td.getAttribute("data-row"));
    const p = Number(td.getAttribute("data-pos"));
    const c = cols.get(p);
    if (!c) return null;
    const lines = [`${x.rowLabel(r)} (${x.rows[r]}) · position ${p}: ${x.tokens[p] ?? ""}`];
    for (let i = 0; i < k; i++) lines.push(`${fmtPct(c.probs[r * k + i]).padStart(6)}  ${x.label(c.ids[r * k + i])}`);
    lines.push(`entropy ${fmt(c.entropy[r])} · KL to final ${fmt(c.kl[r])}`);
    if (x.targets[p] >= 0) lines.push(`target ${x.label(x.targets[p])}: ${fmtPct(c.tprob[r])}, rank ${fmtValue("target_rank", c.trank[r])}`);
    return lines;
  }

  show(ev: MouseEvent): void {
    const lines = this.lines(ev.target as HTMLElement);
    if (!lines) {
      this.hide();
      return;
    }
    const { el, root } = this;
    el.textContent = lines.join("\n");
    const box = root.getBoundingClientRect();
    el.style.display = "block";
    const w = el.offsetWidth;
    const left = ev.clientX - box.left + 14;
    el.style.left = `${Math.max(0, w && left + w > root.clientWidth ? root.clientWidth - w : left)}px`;
    el.style.top = `${ev.clientY - box.top + 14}px`;
  }

  hide(): void {
    this.el.style.display = "none";
  }
}
