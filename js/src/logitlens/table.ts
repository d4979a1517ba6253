// The lens table: one row per layer (the output on top), one column per position, each cell the
// row's top-1 token coloured by the chosen metric, with black or white text, whichever contrasts
// more with the cell (never below 4.5:1). Marks: the target (bold, underlined), the finding's cell
// (ringed), pinned cells (red outline), generated positions (purple italic headers).
import { colorAt } from "../lib/colormap";
import { textColourOn } from "../lib/contrast";
import { h } from "../lib/dom";
import { value, type ColourScale, type Columns } from "./columns";

export interface TableInput {
  cols: Columns;
  positions: number[];
  r0: number;
  r1: number;
  metric: string;
  cmap: string;
  scale: ColourScale;
  pinned: Set<string>;
  /** `[row, pos]` of the finding's cell (-1: none) */
  onset: [number, number];
}

export interface LensText {
  tokens: string[];
  raw: string[];
  rows: string[];
  targets: number[];
  generated: number[];
  label: (id: number) => string;
  rowLabel: (r: number) => string;
}

export function lensTable(x: LensText, t: TableInput): HTMLTableElement {
  const { cols, positions, r0, r1, metric, cmap, scale, pinned, onset } = t;
  const k = cols.k;
  const head = h("tr", {}, [
    h("th", { class: "nbl-row", text: "" }),
    ...positions.map((p) =>
      h("th", { class: x.generated[p] ? "nbl-gen" : "", text: x.tokens[p] ?? "", data: { pos: p, tip: 1 }, title: `${x.raw[p] ?? ""} [${p}]${x.generated[p] ? " (generated)" : ""}` }),
    ),
  ]);
  const body: HTMLElement[] = [];
  for (let r = r1; r >= r0; r--) {
    const tds = positions.map((p) => {
      const c = cols.get(p);
      if (!c) return h("td", { class: "nbl-pending", text: "…", data: { row: r, pos: p } });
      const id = c.ids[r * k];
      const v = scale.t(value(metric, c, r, k));
      // the embeddings row (r 0) echoes the input: drawn muted, not coloured by the metric
      const rgb = Number.isFinite(v) && r > 0 ? colorAt(cmap, v) : ([238, 238, 238] as [number, number, number]);
      return h("td", {
        class: [
          x.targets[p] === id && x.targets[p] >= 0 ? "nbl-target" : "",
          pinned.has(`${r},${p}`) ? "nbl-pinned" : "",
          onset[0] === r && onset[1] === p ? "nbl-onset" : "",
        ],
        text: x.label(id),
        data: { row: r, pos: p, tip: 1 },
        style: { background: `rgb(${rgb[0]}, ${rgb[1]}, ${rgb[2]})`, color: textColourOn(rgb) },
      });
    });
    body.push(h("tr", { class: r === 0 ? "nbl-embed" : "" }, [h("th", { class: "nbl-row", text: x.rowLabel(r), title: `${x.rows[r] ?? ""}${r === 0 ? " (the input embeddings: muted)" : ""}` }), ...tds]));
  }
  return h("table", {}, [h("thead", {}, [head]), h("tbody", {}, body)]);
}
