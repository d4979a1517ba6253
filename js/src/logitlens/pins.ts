// Pinned cells (click a cell): each one's top-20, fetched with rpc "cell" and listed under the table.
import { fmtPct, h, replaceChildren } from "../lib/dom";
import { rpc, type AnyModel } from "../lib/rpc";
import { Latest } from "../lib/request";
import type { LensText } from "./table";

export class Pins {
  readonly el = h("div", { class: "nbl-pins" });
  readonly latest = new Latest();

  constructor(private model: AnyModel, private x: LensText, private learn: (v: Record<string, string>) => void) {}

  pinned(): number[][] {
    return (this.model.get("pinned") || []) as number[][];
  }

  /** Pin or unpin the cell `[row, pos]` (synced to Python). */
  toggle(at: [number, number]): void {
    const cur = this.pinned();
    const has = cur.some(([r, p]) => r === at[0] && p === at[1]);
    this.model.set("pinned", has ? cur.filter(([r, p]) => !(r === at[0] && p === at[1])) : [...cur, at]);
    this.model.save_changes();
  }

  async draw(): Promise<void> {
    const isLatest = this.latest.start();
    const { x } = this;
    const boxes: HTMLElement[] = [];
    for (const [r, p] of this.pinned()) {
      try {
        const ans = await rpc(this.model, "cell", { row: r, pos: p, k: 20 });
        if (!isLatest()) return;
        this.learn(ans.result.vocab);
        const ids = ans.arrays.ids.data;
        const probs = ans.arrays.probs.data;
        const lines = [`${x.rowLabel(r)} · ${x.tokens[p] ?? ""} [${p}]`];
        for (let i = 0; i < ids.length; i++) lines.push(`${fmtPct(probs[i] as number).padStart(6)}  ${x.label(ids[i] as number)}`);
        boxes.push(h("div", { class: "nbl-pin", text: lines.join("\n"), data: { row: r, pos: p } }));
      } catch (err) {
        boxes.push(h("div", { class: "nbl-pin nbl-error", text: String(err) }));
      }
    }
    if (isLatest()) {
      replaceChildren(this.el, boxes);
      this.el.setAttribute("data-ready", "1");
    }
  }
}
