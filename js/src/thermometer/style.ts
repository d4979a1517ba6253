// Styles of the layer thermometer, scoped under .nbdebug-thermometer. JupyterLab theme variables
// with fallbacks, so the view reads well in the light and dark themes and outside JupyterLab.
// Legibility (issue 22): every text colour is the theme's text colour or a mix of it that keeps WCAG
// AA (4.5:1) on the view's backgrounds (JupyterLab's own secondary colours do not on its grey
// panels); --nbd-fg3 is for lines and marks only, never text. Below 1000 px of width (a narrow
// notebook) the table's columns shrink and its cells wrap instead of cutting text.
import { chartCss } from "../lib/chart";

export const CSS = `
.nbdebug-thermometer {
  container-type: inline-size;
  --nbd-fg: var(--jp-ui-font-color1, #222);
  --nbd-fg2: color-mix(in srgb, var(--nbd-fg) 80%, transparent);
  --nbd-fg3: var(--jp-ui-font-color3, #999);
  --nbd-link: color-mix(in srgb, var(--nbd-accent) 72%, var(--nbd-fg));
  --nbd-bg: var(--jp-layout-color1, transparent);
  --nbd-bg2: var(--jp-layout-color2, rgba(127,127,127,0.08));
  --nbd-border: var(--jp-border-color2, rgba(127,127,127,0.3));
  --nbd-accent: var(--jp-brand-color1, #1976d2);
  --nbd-select: var(--jp-brand-color3, rgba(25,118,210,0.18));
  --nbd-cols: 2.6em minmax(9em, 1.7fr) minmax(5em, 0.8fr) minmax(6em, 0.9fr) minmax(12em, 2.6fr) 6.5em 7em minmax(8em, 1.2fr) minmax(6em, 1.1fr);
  color: var(--nbd-fg);
  background: var(--nbd-bg);
  font-family: var(--jp-ui-font-family, system-ui, -apple-system, "Segoe UI", sans-serif);
  font-size: var(--jp-ui-font-size1, 13px);
  line-height: 1.35;
  max-width: 100%;
  box-sizing: border-box;
}
.nbdebug-thermometer * { box-sizing: border-box; }
.nbdebug-thermometer .nbd-finding { font-weight: 700; font-size: 1.12em; margin: 2px 0 4px; overflow-wrap: anywhere; }
.nbdebug-thermometer .nbd-findings { margin: 0 0 6px; padding-left: 1.6em; }
.nbdebug-thermometer .nbd-findings li { margin: 2px 0; overflow-wrap: anywhere; }
.nbdebug-thermometer .nbd-findings li.nbd-follows { list-style: none; margin-left: 1.2em; counter-increment: none; }
.nbdebug-thermometer .nbd-findings li.nbd-sev-note { opacity: 0.75; }
.nbdebug-thermometer .nbd-findings li.nbd-sev-error > .nbd-step-link { font-weight: 700; }
.nbdebug-thermometer .nbd-follows-mark { font-weight: 700; }
.nbdebug-thermometer .nbd-summary { margin: 2px 0 4px; overflow-wrap: anywhere; }
.nbdebug-thermometer code {
  font-family: var(--jp-code-font-family, ui-monospace, Menlo, Consolas, monospace);
  background: var(--nbd-bg2); padding: 0 3px; border-radius: 3px; border: 1px solid var(--nbd-border);
  color: var(--nbd-fg);
}
.nbdebug-thermometer .nbd-raised {
  border: 1px solid #b30000; border-left-width: 4px; border-radius: 4px; padding: 4px 8px; margin: 4px 0 6px;
}
.nbdebug-thermometer .nbd-raised-head { font-weight: 600; }
.nbdebug-thermometer .nbd-raised-error { font-weight: 400; color: var(--nbd-fg2); }
.nbdebug-thermometer .nbd-raised-problems { margin: 2px 0; padding-left: 1.2em; }
.nbdebug-thermometer .nbd-raised-label { color: var(--nbd-fg2); }
.nbdebug-thermometer .nbd-dtype { color: var(--nbd-fg2); font-size: 0.9em; }
.nbdebug-thermometer .nbd-notes { margin: 0 0 6px; padding-left: 1.2em; color: var(--nbd-fg2); font-size: 0.92em; overflow-wrap: anywhere; }
.nbdebug-thermometer details > summary { cursor: pointer; color: var(--nbd-fg2); font-size: 0.92em; }
.nbdebug-thermometer .nbd-notes-box, .nbdebug-thermometer .nbd-diag-box { margin: 4px 0; }
.nbdebug-thermometer .nbd-bar-row { display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: center; margin: 4px 0 6px; }
.nbdebug-thermometer .nbd-legend { display: flex; flex-wrap: wrap; gap: 4px 10px; font-size: 0.9em; color: var(--nbd-fg2); }
.nbdebug-thermometer .nbd-legend-item { display: inline-flex; align-items: center; gap: 4px; }
.nbdebug-thermometer .nbd-legend-item.nbd-absent { display: none; }
.nbdebug-thermometer .nbd-swatch { width: 10px; height: 10px; border-radius: 2px; display: inline-block; }
.nbdebug-thermometer .nbd-controls { display: flex; gap: 12px; align-items: center; margin-left: auto; color: var(--nbd-fg2); font-size: 0.92em; }
.nbdebug-thermometer .nbd-controls label { display: inline-flex; gap: 4px; align-items: center; cursor: pointer; color: var(--nbd-fg); }
.nbdebug-thermometer .nbd-table {
  border: 1px solid var(--nbd-border); border-radius: 4px; max-height: 560px; overflow: auto;
}
.nbdebug-thermometer .nbd-row, .nbdebug-thermometer .nbd-head {
  display: grid; grid-template-columns: var(--nbd-cols); align-items: center; column-gap: 8px;
  padding: 2px 6px 2px 3px; border-left: 3px solid transparent; min-width: 860px;
}
.nbdebug-thermometer .nbd-head {
  position: sticky; top: 0; z-index: 1; background: var(--jp-layout-color2, #f3f3f3);
  border-bottom: 1px solid var(--nbd-border); font-weight: 600; color: var(--nbd-fg2); font-size: 0.9em;
}
.nbdebug-thermometer .nbd-head > div { cursor: pointer; user-select: none; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.nbdebug-thermometer .nbd-head > div:hover { color: var(--nbd-fg); }
.nbdebug-thermometer .nbd-head .nbd-sorted { color: var(--nbd-link); }
.nbdebug-thermometer .nbd-head .nbd-sub { font-weight: 400; margin-left: 4px; }
.nbdebug-thermometer .nbd-head .nbd-sub span { margin: 0 2px; text-decoration: underline dotted; }
.nbdebug-thermometer .nbd-row { cursor: pointer; border-bottom: 1px solid var(--jp-border-color3, rgba(127,127,127,0.12)); content-visibility: auto; contain-intrinsic-size: auto 23px; }
.nbdebug-thermometer .nbd-row:hover { background: var(--nbd-bg2); }
.nbdebug-thermometer .nbd-row.nbd-flagged { border-left-color: var(--nbd-flag); background: var(--nbd-flag-bg); }
.nbdebug-thermometer .nbd-row.nbd-selected { outline: 2px solid var(--nbd-accent); outline-offset: -2px; }
.nbdebug-thermometer .nbd-row > div { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; min-width: 0; }
.nbdebug-thermometer .nbd-row > div.nbd-flags { white-space: normal; line-height: 1.5; }
.nbdebug-thermometer .nbd-idx, .nbdebug-thermometer .nbd-num { color: var(--nbd-fg2); font-variant-numeric: tabular-nums; }
.nbdebug-thermometer .nbd-row > div.nbd-evidence { color: var(--nbd-fg); font-weight: 700; }
.nbdebug-thermometer .nbd-name { font-family: var(--jp-code-font-family, ui-monospace, Menlo, Consolas, monospace); font-size: 0.95em; }
.nbdebug-thermometer .nbd-calls { color: var(--nbd-fg2); margin-left: 4px; }
.nbdebug-thermometer .nbd-type, .nbdebug-thermometer .nbd-shape { color: var(--nbd-fg2); font-size: 0.92em; }
.nbdebug-thermometer .nbd-track { position: relative; height: 16px; }
.nbdebug-thermometer .nbd-track > span { position: absolute; display: block; }
.nbdebug-thermometer .nbd-zero { top: 0; bottom: 0; width: 1px; background: var(--nbd-fg3); opacity: 0.6; }
.nbdebug-thermometer .nbd-range { top: 7.5px; height: 1px; background: var(--nbd-fg2); }
.nbdebug-thermometer .nbd-box { top: 3px; height: 10px; background: var(--nbd-accent); opacity: 0.55; border-radius: 2px; min-width: 2px; }
.nbdebug-thermometer .nbd-mean { top: 1px; height: 14px; width: 2px; margin-left: -1px; background: var(--nbd-fg); }
.nbdebug-thermometer .nbd-axis { position: relative; height: 1.2em; font-weight: 400; font-size: 0.85em; overflow: hidden; }
.nbdebug-thermometer .nbd-axis span { position: absolute; transform: translateX(-50%); white-space: nowrap; }
.nbdebug-thermometer .nbd-mini { display: inline-block; vertical-align: middle; width: 28px; height: 6px; background: var(--nbd-bg2); border-radius: 2px; margin-right: 4px; position: relative; overflow: hidden; }
.nbdebug-thermometer .nbd-mini > span { position: absolute; left: 0; top: 0; bottom: 0; background: var(--nbd-fg2); }
.nbdebug-thermometer .nbd-gbar { display: inline-block; vertical-align: middle; height: 8px; background: var(--nbd-accent); opacity: 0.7; border-radius: 2px; margin-right: 4px; }
.nbdebug-thermometer .nbd-empty { color: var(--nbd-fg2); }
.nbdebug-thermometer .nbd-badge {
  display: inline-block; padding: 0 4px; border-radius: 3px; font-size: 0.82em; font-weight: 600;
  color: #fff; background: #b00020; margin-right: 3px;
}
.nbdebug-thermometer .nbd-badge.nbd-inf { background: #bf360c; }
.nbdebug-thermometer .nbd-badge.nbd-grad { background: #7b1fa2; }
.nbdebug-thermometer .nbd-badge.nbd-grad.nbd-inf { background: #4a148c; }
.nbdebug-thermometer .nbd-chip {
  display: inline-block; padding: 0 5px; border-radius: 8px; font-size: 0.82em; margin-right: 3px;
  background: var(--nbd-chip, #777);
}
.nbdebug-thermometer .nbd-nothing { padding: 8px; color: var(--nbd-fg2); }
.nbdebug-thermometer .nbd-detail { margin-top: 8px; padding: 6px 8px; border: 1px solid var(--nbd-border); border-radius: 4px; display: flex; flex-wrap: wrap; gap: 8px 18px; }
.nbdebug-thermometer .nbd-detail:empty { display: none; }
.nbdebug-thermometer .nbd-detail-title { width: 100%; font-weight: 600; }
.nbdebug-thermometer .nbd-hist-box { display: flex; flex-direction: column; gap: 2px; }
.nbdebug-thermometer canvas.nbdebug-histogram { width: 360px; height: 120px; border-bottom: 1px solid var(--nbd-border); }
.nbdebug-thermometer .nbd-hist-axis { display: flex; justify-content: space-between; width: 360px; color: var(--nbd-fg2); font-size: 0.85em; }
.nbdebug-thermometer .nbd-hist-note, .nbdebug-thermometer .nbd-hist-when { color: var(--nbd-fg2); font-size: 0.88em; }
.nbdebug-thermometer .nbd-error { color: var(--jp-error-color1, #c62828); white-space: pre-wrap; }
.nbdebug-thermometer .nbd-stats { border-collapse: collapse; font-size: 0.9em; align-self: flex-start; }
.nbdebug-thermometer .nbd-stats td { padding: 0 8px 0 0; }
.nbdebug-thermometer .nbd-stats td:first-child { color: var(--nbd-fg2); }
.nbdebug-thermometer .nbd-diagnoses { margin: 4px 0 0; padding: 0; list-style: none; overflow-wrap: anywhere; }
.nbdebug-thermometer .nbd-diagnoses li { margin: 4px 0; padding: 4px 8px; border-left: 3px solid var(--nbd-chip, #777); background: var(--nbd-bg2); border-radius: 0 4px 4px 0; }
.nbdebug-thermometer .nbd-diagnoses .nbd-sev { font-size: 0.8em; text-transform: uppercase; color: var(--nbd-fg2); margin-right: 6px; }
.nbdebug-thermometer .nbd-diagnoses .nbd-suggestion { color: var(--nbd-fg2); font-size: 0.92em; margin-top: 2px; }
.nbdebug-thermometer.nbd-timed { --nbd-cols: 2.6em minmax(9em, 1.7fr) minmax(5em, 0.8fr) minmax(6em, 0.9fr) minmax(12em, 2.6fr) 6.5em 7em minmax(8em, 1.2fr) minmax(6em, 1.1fr) 118px; }
.nbdebug-thermometer.nbd-timed .nbd-row, .nbdebug-thermometer.nbd-timed .nbd-head { min-width: 980px; }
.nbdebug-thermometer .nbd-timeline { margin: 4px 0 6px; }
.nbdebug-thermometer .nbd-slider-row { display: flex; flex-wrap: wrap; align-items: center; gap: 6px 12px; }
.nbdebug-thermometer .nbd-slider-box { position: relative; flex: 1 1 260px; min-width: 200px; padding-bottom: 6px; }
.nbdebug-thermometer .nbd-slider { width: 100%; margin: 0; }
.nbdebug-thermometer .nbd-slider-ticks { position: absolute; left: 8px; right: 8px; bottom: 0; height: 6px; }
.nbdebug-thermometer .nbd-tick { position: absolute; width: 2px; height: 6px; margin-left: -1px; background: var(--nbd-fg3); }
.nbdebug-thermometer .nbd-tick.nbd-mark-nan { background: #b30000; width: 3px; }
.nbdebug-thermometer .nbd-step-count, .nbdebug-thermometer .nbd-step-label { font-variant-numeric: tabular-nums; white-space: nowrap; }
.nbdebug-thermometer .nbd-step-count { color: var(--nbd-fg2); }
.nbdebug-thermometer .nbd-timeline button { font: inherit; font-size: 0.9em; padding: 0 6px; border: 1px solid var(--nbd-border); border-radius: 3px; background: var(--nbd-bg2); color: var(--nbd-fg); cursor: pointer; }
.nbdebug-thermometer .nbd-timeline button.nbd-on { background: var(--nbd-select); border-color: var(--nbd-accent); }
.nbdebug-thermometer .nbd-goto-nan { color: #b30000 !important; }
.nbdebug-thermometer .nbd-loss { margin: 2px 0 4px; }
.nbdebug-thermometer svg.nbd-spark { display: block; overflow: visible; }
.nbdebug-thermometer .nbd-spark-line { fill: none; stroke: var(--nbd-accent); stroke-width: 1.2; }
.nbdebug-thermometer .nbd-spark-band { fill: none; stroke: var(--nbd-accent); stroke-opacity: 0.3; stroke-width: 1; }
.nbdebug-thermometer .nbd-spark-cursor { stroke: var(--nbd-fg); stroke-opacity: 0.55; stroke-width: 1; }
.nbdebug-thermometer .nbd-spark-mark { stroke-width: 1; }
.nbdebug-thermometer .nbd-mark-nan { stroke: #b30000; stroke-width: 1.5; }
.nbdebug-thermometer .nbd-mark-skip { stroke: var(--nbd-fg3); stroke-dasharray: 2 2; }
.nbdebug-thermometer .nbd-events { margin: 4px 0; padding: 0 0 0 1.2em; max-height: 14em; overflow-y: auto; overflow-wrap: anywhere; }
.nbdebug-thermometer .nbd-events li { margin: 2px 0; }
.nbdebug-thermometer .nbd-events li.nbd-incident { border-left: 3px solid #b30000; padding-left: 6px; list-style: none; margin-left: -1.2em; }
.nbdebug-thermometer .nbd-events li.nbd-incident-loss_spike { border-left-color: #e6550d; }
.nbdebug-thermometer .nbd-incident-head { font-weight: 600; }
.nbdebug-thermometer .nbd-link { color: var(--nbd-link); cursor: pointer; text-decoration: underline; }
${chartCss(".nbdebug-thermometer")}
.nbdebug-thermometer .nbd-spark-cell svg { width: 100%; max-width: 110px; }
@container (max-width: 1000px) {
  .nbdebug-thermometer .nbd-table, .nbdebug-thermometer .nbd-groups { --nbd-cols: 1.8em minmax(4.2em, 1.4fr) minmax(3.4em, 0.8fr) minmax(3.4em, 0.8fr) minmax(5.5em, 2fr) 4.4em 4em minmax(4.4em, 1fr) minmax(4.4em, 1fr); }
  .nbdebug-thermometer.nbd-timed .nbd-table, .nbdebug-thermometer.nbd-timed .nbd-groups { --nbd-cols: 1.8em minmax(4.2em, 1.4fr) minmax(3.4em, 0.8fr) minmax(3.4em, 0.8fr) minmax(5.5em, 2fr) 4.4em 4em minmax(4.4em, 1fr) minmax(4.4em, 1fr) minmax(44px, 90px); }
  .nbdebug-thermometer .nbd-row, .nbdebug-thermometer .nbd-head,
  .nbdebug-thermometer.nbd-timed .nbd-row, .nbdebug-thermometer.nbd-timed .nbd-head { min-width: 0; column-gap: 5px; }
  .nbdebug-thermometer .nbd-row > div, .nbdebug-thermometer .nbd-head > div { white-space: normal; overflow-wrap: anywhere; text-overflow: clip; }
  .nbdebug-thermometer .nbd-mini { width: 14px; }
  .nbdebug-thermometer .nbd-head .nbd-sub span { margin: 0 1px; }
  .nbdebug-thermometer .nbd-axis span:not(:first-child):not(:last-child) { display: none; }
  .nbdebug-thermometer canvas.nbdebug-histogram, .nbdebug-thermometer .nbd-hist-axis { width: min(360px, 100%); }
}
`;
