// @vitest-environment happy-dom
// The one lens-column table (src/lib/lenscolumn.ts), as the patching view (three runs, final block on
// top, a run not fetched yet) and the attention view's ablation (two runs, embeddings on top, changed
// rows marked, row tooltips) draw it: headers, row order, p(answer) or "–", the top-1's id and p in its
// tooltip, and model text kept as text.
import { describe, expect, it } from "vitest";
import { lensColumnTable, type LensEntry } from "../src/lib/lenscolumn";

const HOSTILE = "<img src=x onerror=alert(1)>";
const col = (...rows: [string, number, string, number, number][]): LensEntry[] =>
  rows.map(([row, id, token, p, p_answer]) => ({ row, id, token, p, p_answer }));

const CLEAN = col(["embed", 1, "a", 0.2, 0.01], ["h.0", 2, "b", 0.3, 0.1], ["h.1", 3, HOSTILE, 0.6, 0.5]);
const OTHER = col(["embed", 1, "a", 0.2, -1], ["h.0", 4, "c", 0.4, -1], ["h.1", 3, HOSTILE, 0.5, -1]);

const texts = (els: ArrayLike<Element>) => Array.from(els, (e) => e.textContent);

describe("lensColumnTable", () => {
  it("the patching view's shape: three runs, final block first, a missing run empty", () => {
    const t = lensColumnTable([{ name: "clean", entries: CLEAN }, { name: "corrupt", entries: OTHER }, { name: "patched", entries: undefined }],
      { prefix: "nbp", rowHeader: "block", answer: "answer", finalFirst: true });
    expect(texts(t.querySelectorAll("thead th"))).toEqual(["block", "clean top-1", "p(answer)", "corrupt top-1", "p(answer)", "patched top-1", "p(answer)"]);
    const rows = t.querySelectorAll("tbody tr");
    expect(rows.length).toBe(3);
    expect(Array.from(rows, (r) => r.getAttribute("data-row"))).toEqual(["2", "1", "0"]);
    expect(texts(t.querySelectorAll("th.nbp-lens-row"))).toEqual(["h.1", "h.0", "embed"]);
    expect(texts(t.querySelectorAll("td.nbp-lens-clean"))).toEqual([HOSTILE, "b", "a"]);
    expect(texts(t.querySelectorAll("td.nbp-lens-corrupt"))).toEqual([HOSTILE, "c", "a"]);
    expect(t.querySelectorAll("td.nbp-lens-patched").length).toBe(0);
    expect(texts(rows[0].querySelectorAll("td.nbp-p"))).toEqual(["50%", "–"]); // no answer: –
    expect(rows[1].querySelector("td.nbp-lens-clean")!.getAttribute("title")).toBe("b (#2) p=30%");
    expect(t.querySelector("img")).toBeNull();
    expect(t.querySelectorAll(".nbp-changed").length).toBe(0); // not asked for
  });

  it("the ablation's shape: two runs, embeddings first, rows whose top-1 changed marked", () => {
    const t = lensColumnTable([{ name: "clean", entries: CLEAN }, { name: "ablated", entries: OTHER }], {
      prefix: "nba", rowHeader: "lens (last position)", answer: HOSTILE, markChanged: true, cls: "nba-ablate-lens",
      rowTitle: (name, i, n) => (i === 0 ? "the embeddings" : i === n - 1 ? "the model's output" : `after ${name}`),
    });
    expect(t.classList.contains("nba-ablate-lens")).toBe(true);
    expect(t.querySelectorAll("tr").length).toBe(1 + 3);
    expect(texts(t.querySelectorAll("thead th"))).toEqual(["lens (last position)", "clean top-1", `p(${HOSTILE})`, "ablated top-1", `p(${HOSTILE})`]);
    const rows = t.querySelectorAll("tbody tr");
    expect(texts(t.querySelectorAll("th.nba-lens-row"))).toEqual(["embed", "h.0", "h.1"]);
    expect(Array.from(rows, (r) => r.classList.contains("nba-changed"))).toEqual([false, true, false]);
    expect(Array.from(t.querySelectorAll("th.nba-lens-row"), (e) => e.getAttribute("title"))).toEqual(["the embeddings", "after h.0", "the model's output"]);
    expect(texts(rows[2].querySelectorAll("td.nba-p"))).toEqual(["50%", "–"]);
    expect(t.querySelector("img")).toBeNull();
  });

  it("no rows: only the header", () => {
    const t = lensColumnTable([{ name: "clean", entries: [] }], { prefix: "x", rowHeader: "block", answer: "answer" });
    expect(t.querySelectorAll("tbody tr").length).toBe(0);
    expect(t.querySelectorAll("thead th").length).toBe(3);
  });
});
