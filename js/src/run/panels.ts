// The run view's panels: the rank selector, the first-NaN card, the parameters that differ across
// ranks, the buffers that differ by design, errors per rank. Text from the kernel (parameter and
// module names, error messages) is untrusted: text nodes only.
import { h, replaceChildren } from "../lib/dom";
import { withCode } from "../thermometer/cards";

export interface RankInfo {
  rank: number;
  recorded: boolean;
  steps: number;
  nonfinite: boolean;
  error: string;
  hooks_left: number;
  closed?: boolean;
}

export interface NonFinite {
  rank: number;
  step: number;
  phase: string;
  module: string | null;
  row: string | null;
  message?: string;
}

export interface Named {
  name: string;
  step: number | null;
}

export interface RankError {
  rank: number;
  error: string;
  traceback?: string;
}

const PHASE: Record<string, string> = { forward: "forward", output_grad: "output gradient", param_grad: "parameter gradient" };

/** One button per rank (data-rank), marked when the rank had a NaN/Inf, raised, or left hooks. */
export function renderSelector(box: HTMLElement, ranks: RankInfo[], current: number, loading: number | null): void {
  const list = Array.isArray(ranks) ? ranks : [];
  replaceChildren(box, [
    h("span", { class: "nbd-run-label", text: "rank" }),
    ...list.map((r) => {
      const marks = [
        r.nonfinite ? h("span", { class: "nbd-rank-mark nbd-rank-nan", text: "NaN", title: "this rank saw a NaN/Inf" }) : null,
        r.error ? h("span", { class: "nbd-rank-mark nbd-rank-error", text: "error", title: `raised ${r.error}` }) : null,
        r.hooks_left ? h("span", { class: "nbd-rank-mark nbd-rank-hooks", text: `${r.hooks_left} hooks left`, title: "hooks nbdebug left on this rank's model" }) : null,
      ];
      const title = r.recorded ? `rank ${r.rank}: ${r.steps} step${r.steps === 1 ? "" : "s"}` + (r.error ? `; raised ${r.error}` : "") : `rank ${r.rank} recorded nothing`;
      return h(
        "button",
        {
          class: ["nbd-rank-btn", r.rank === current && "nbd-rank-active", loading === r.rank && "nbd-rank-loading", !r.recorded && "nbd-rank-empty"],
          data: { rank: Number(r.rank) },
          attrs: { type: "button", disabled: !r.recorded, "aria-pressed": r.rank === current ? "true" : "false" },
          title,
        },
        [String(Number(r.rank)), ...marks],
      );
    }),
  ]);
}

/** "first NaN/Inf: rank 1, step 3, `1` (forward); also rank 0 at step 3 (parameter gradient)". */
export function renderNonFinite(box: HTMLElement, list: NonFinite[]): void {
  const items = Array.isArray(list) ? list : [];
  box.style.display = items.length ? "" : "none";
  if (!items.length) {
    replaceChildren(box, []);
    return;
  }
  const link = (f: NonFinite, text: string) =>
    h("span", { class: "nbd-link nbd-rank-link", text, title: "show this rank at this step", data: { rank: Number(f.rank), step: Number(f.step) || 0, layer: String(f.row ?? "") } });
  const f = items[0];
  const also = items.slice(1).flatMap((x, i) => [i ? "; " : "", link(x, `rank ${x.rank} at step ${x.step}`), ` (${PHASE[x.phase] ?? String(x.phase)})`]);
  replaceChildren(box, [
    h("div", { class: "nbd-run-nonfinite-head" }, [
      "first NaN/Inf: ",
      link(f, `rank ${f.rank}, step ${f.step}`),
      ", ",
      h("code", { text: String(f.module ?? "?") }),
      ` (${PHASE[f.phase] ?? String(f.phase)})`,
      also.length ? "; also " : "",
      ...also,
    ]),
    f.message ? h("div", { class: "nbd-run-message" }, withCode(String(f.message))) : null,
  ]);
}

/** Parameters that differ across ranks (with the step they first differed), and the buffers apart. */
export function renderDiverged(box: HTMLElement, diverged: Named[], buffers: Named[], compared: number, ranks: number): void {
  const d = Array.isArray(diverged) ? diverged : [];
  const b = Array.isArray(buffers) ? buffers : [];
  const item = (x: Named) => h("li", {}, [h("code", { text: String(x.name) }), x.step ? ` from step ${x.step}` : ""]);
  const parts = [];
  if (d.length) {
    parts.push(h("div", { class: "nbd-run-diverged-head", text: `parameters that differ across ranks after step ${compared} (changed outside DDP's sync):` }));
    parts.push(h("ul", { class: "nbd-run-diverged-list" }, d.map(item)));
  } else if (compared && ranks > 1) {
    parts.push(h("div", { class: "nbd-run-same", text: `no parameter differs across ranks after step ${compared}` }));
  }
  if (b.length) {
    parts.push(h("div", { class: "nbd-run-buffers-head", text: "buffers that differ (re-broadcast or not synchronised: by design, not divergence):" }));
    parts.push(h("ul", { class: "nbd-run-buffers-list" }, b.map(item)));
  }
  replaceChildren(box, parts);
  box.style.display = parts.length ? "" : "none";
}

/** Each rank's error (the first raised is the cause), its traceback folded. */
export function renderErrors(box: HTMLElement, errors: RankError[]): void {
  const list = Array.isArray(errors) ? errors : [];
  replaceChildren(
    box,
    list.map((e, i) =>
      h("div", { class: "nbd-run-error", data: { rank: Number(e.rank) } }, [
        h("span", { class: "nbd-link nbd-rank-link", text: `rank ${e.rank}`, data: { rank: Number(e.rank), step: 0, layer: "" } }),
        ` raised ${String(e.error)}` + (i === 0 && list.length > 1 ? " (first: the others followed)" : ""),
        e.traceback ? h("details", {}, [h("summary", { text: "traceback" }), h("pre", { text: String(e.traceback) })]) : null,
      ]),
    ),
  );
  box.style.display = list.length ? "" : "none";
}
