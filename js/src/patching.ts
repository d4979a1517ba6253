// Activation-patching view: the grid of how much each site (rows) at each position or head
// (columns) restores the clean run's answer when patched into the corrupt run, on a diverging scale
// (white 0, blue +1: toward the answer, red −1: against it, as in the attribution view) with the effect and the raw metric on hover. A site selector fetches the
// other site kinds (rpc "grid", computed on demand in the kernel); the triage toggle shows the
// attribution estimate instead (its top cells verified exactly: bold border). Clicking a cell runs
// that patch in the kernel (rpc "cell", from the recorded clean/corrupt runs) and shows its top-5
// next tokens beside the clean and corrupt runs', and the three runs' logit-lens columns. Python side: nbdebug/widgets/patching.py.
// Tokens and module names are untrusted: textContent only.
//
// Parts: patching/colour.ts (the diverging scale, colour bar), grid.ts (cells, hover, click),
// tops.ts (next-token tables), lens.ts (the lens columns), style.ts.
import { codeCss, fmt, h, replaceChildren, styleElement, withCode } from "./lib/dom";
import { rpc, type AnyModel } from "./lib/rpc";
import { Latest, Listeners } from "./lib/request";
import { divergingBar } from "./patching/colour";
import { GridView, gridFromTraits, type GridData } from "./patching/grid";
import { CSS } from "./patching/style";
import { type TopToken } from "./lib/tokens";
import { Tops, type CellAnswer } from "./patching/tops";

/** Two fixed decimals ("n/a" for NaN): effects and metrics in the click sentence. */
const fixed2 = (x: number): string => (Number.isFinite(x) ? x.toFixed(2) : "n/a");

function render({ model, el }: { model: AnyModel; el: HTMLElement }): () => void {
  const metric = { label: String(model.get("metric") || "metric"), clean: model.get("metric_clean"), corrupt: model.get("metric_corrupt") };
  const kinds: string[] = model.get("site_kinds") || ["resid", "attn", "mlp", "heads"];
  let data: GridData = gridFromTraits((n) => model.get(n));
  const listeners = new Listeners();
  const latest = new Latest();

  const title = h("div", { class: "nbp-title nbd-headline" }, withCode(String(model.get("headline") || "")));
  const prompts = h("div", { class: "nbp-sub" }, [
    h("div", { text: `clean: ${(model.get("tokens_clean") || []).join(" | ")}  (${metric.label} = ${fmt(metric.clean)})` }),
    h("div", { text: `corrupt: ${(model.get("tokens_corrupt") || []).join(" | ")}  (${metric.label} = ${fmt(metric.corrupt)})` }),
  ]);
  const siteSel = h("select", { class: "nbp-sites", attrs: { "aria-label": "sites" } },
    kinds.map((k) => h("option", { text: k, attrs: { value: k } })));
  siteSel.value = data.sites;
  const triage = h("input", { class: "nbp-triage", attrs: { type: "checkbox" } });
  triage.checked = data.method === "attribution";
  const controls = h("div", { class: "nbp-controls" }, [
    h("label", {}, ["sites ", siteSel]),
    h("label", { title: "attribution patching: a gradient estimate of every cell from one forward and one backward; its top cells are verified exactly (bold border)" }, [triage, " triage (attribution estimate)"]),
    divergingBar(),
  ]);
  const status = h("div", { class: "nbp-status" });
  const notes = h("div", { class: "nbp-note" });
  const tops = new Tops(model.get("top_clean") as TopToken[] || [], model.get("top_corrupt") as TopToken[] || [],
    { clean: model.get("answer_clean") ?? null, corrupt: model.get("answer_corrupt") ?? null });
  const grid = new GridView(metric, (r, c) => void click(r, c));
  const root = h("div", { class: "nbdebug-patching" }, [styleElement(CSS + codeCss(".nbdebug-patching")), title, prompts, controls, status, grid.el, grid.tip, notes, tops.el]);
  const onHeadline = () => {
    replaceChildren(title, withCode(String(model.get("headline") || "")));
  };
  listeners.model(model, "change:headline", onHeadline);
  el.appendChild(root);

  const showGrid = (d: GridData) => {
    data = d;
    grid.draw(d);
    const how = d.method === "attribution" ? `attribution estimate, ${d.verified.length} cells verified exactly (bold border)` : "exact";
    status.textContent = `${d.sites}: ${d.rows.length} × ${d.columns.length} (${how}; blue restores the answer, red pushes against it; ` +
      `|effect| < 0.05 not printed) · click a cell to run that patch`;
    status.classList.remove("nbp-error");
    notes.textContent = d.notes.join(" · ");
    root.setAttribute("data-sites", d.sites);
    root.setAttribute("data-method", d.method);
  };

  const fetchGrid = async () => {
    const isLatest = latest.start();
    const sites = siteSel.value, method = triage.checked ? "attribution" : "exact";
    status.textContent = `computing the ${sites} grid (${method})…`;
    try {
      const ans = await rpc(model, "grid", { sites, method }, 600_000);
      if (!isLatest()) return;
      const r = ans.result;
      if (r.headline) replaceChildren(title, withCode(r.headline));
      showGrid({ rows: r.rows, rowLabels: r.row_labels, columns: r.columns, sites: r.sites, method: r.method, verified: r.verified, notes: r.notes,
                 effect: ans.arrays.effect, raw: ans.arrays.raw, identical: ans.arrays.identical });
      tops.show(null, "");
    } catch (err) {
      if (!isLatest()) return;
      status.textContent = String((err as Error).message || err);
      status.classList.add("nbp-error");
    }
  };

  const click = async (row: number, col: number) => {
    const isLatest = latest.start();
    grid.select(row, col);
    const label = `${data.rowLabels?.[row] ?? data.rows[row]} @ ${data.columns[col]}`;
    const summary = status.textContent;
    status.textContent = `running the patch ${label}…`;
    try {
      const ans = await rpc<CellAnswer>(model, "cell", { sites: data.sites, method: data.method, row, col });
      if (!isLatest()) return;
      tops.show(ans.result, label);
      status.textContent = summary;
      grid.pin(row, col, `${label}: effect ${fixed2(ans.result.effect)} (${metric.label} = ${fixed2(ans.result.metric)}), measured exactly`);
      status.classList.remove("nbp-error");
      root.setAttribute("data-clicked", `${row},${col}`);
    } catch (err) {
      if (!isLatest()) return;
      status.textContent = String((err as Error).message || err);
      status.classList.add("nbp-error");
    }
  };

  listeners.dom(siteSel, "change", () => void fetchGrid());
  listeners.dom(triage, "change", () => void fetchGrid());
  showGrid(data);
  root.setAttribute("data-ready", "1");
  return () => {
    latest.dispose();
    listeners.dispose();
  };
}

export default { render };
