// The header row of the thermometer table: sortable column titles, the activation scale's ticks,
// and the "over time" column when the run has a history.
import { fmt, h, replaceChildren } from "../lib/dom";
import type { Scales } from "./rows";

interface HeaderSpec {
  label: string;
  sort: string;
  title: string;
  /** Sort direction on the first click (numbers: largest first). */
  desc?: boolean;
}

export const HEADERS: HeaderSpec[] = [
  { label: "#", sort: "", title: "execution order (click to reset the sort)" },
  { label: "layer", sort: "name", title: "layer output (module name, [i] for tuple outputs)" },
  { label: "type", sort: "type", title: "module type" },
  { label: "shape", sort: "shape", title: "output shape", desc: true },
  { label: "activations", sort: "std", title: "mean ± std (box), min … max (line), shared symlog scale", desc: true },
  { label: "zeros", sort: "zero_frac", title: "fraction of exact zeros", desc: true },
  { label: "NaN / Inf", sort: "nonfinite", title: "non-finite values (∇ = in the gradient)", desc: true },
  { label: "‖∂L/∂out‖", sort: "grad_norm", title: "norm of the loss's gradient at the layer's output, ‖∂L/∂out‖ (log scale)", desc: true },
  { label: "flags", sort: "flags", title: "diagnoses for this layer", desc: true },
];

/** Redraw the header cells; `spark` names the stat of the "over time" column ("" for none). */
export function buildHeader(head: HTMLElement, scales: Scales | null, sortBy: string, desc: boolean, spark: string): void {
  const cells = HEADERS.map((spec) => {
    const active = spec.sort === sortBy;
    const arrow = active && spec.sort !== "" ? (desc ? " ▼" : " ▲") : "";
    const cell = h("div", { class: ["nbd-h", active && "nbd-sorted"], title: spec.title, data: { sort: spec.sort } }, [spec.label + arrow]);
    if (spec.label === "activations" && scales) {
      // Sub-sorts and a tick axis of the shared scale.
      const sub = h("span", { class: "nbd-sub" }, ["(", ...["mean", "min", "max"].map((c) => h("span", { text: c, data: { sort: c }, class: c === sortBy ? "nbd-sorted" : "" })), ")"]);
      cell.appendChild(sub);
      const axis = h("div", { class: "nbd-axis" });
      let last = -Infinity;
      for (const t of scales.act.ticks(6)) {
        const pos = scales.act.clamped(t);
        if (pos - last < 12) continue; // labels would overlap
        last = pos;
        // Labels near the ends are anchored inside the cell instead of centred on the tick (never cut).
        const shift = pos < 15 ? "0" : pos > 85 ? "-100%" : "-50%";
        axis.appendChild(h("span", { text: fmt(t), style: { left: `${pos.toFixed(2)}%`, transform: `translateX(${shift})` } }));
      }
      cell.appendChild(axis);
    }
    return cell;
  });
  if (spark) cells.push(h("div", { class: "nbd-h nbd-h-spark", text: `${spark} over time`, title: "the chosen statistic at every kept step (band: min/max of merged steps); red line: first NaN/Inf" }));
  replaceChildren(head, cells);
}
