// Styles of the run view (scoped under .nbdebug-run); the rank's table keeps the thermometer's own
// styles, with one more grid column for the spread across ranks (narrow: it wraps like the others).
// Text colours keep WCAG AA (4.5:1): no opacity on text, marks with dark backgrounds.
export const RUN_CSS = `
.nbdebug-run {
  --nbd-run-fg2: color-mix(in srgb, var(--jp-ui-font-color1, #222) 80%, transparent);
  --nbd-run-border: var(--jp-border-color2, rgba(127,127,127,0.3));
  --nbd-run-accent: var(--jp-brand-color1, #1976d2);
  --nbd-run-link: color-mix(in srgb, var(--nbd-run-accent) 72%, var(--jp-ui-font-color1, #222));
  font-family: var(--jp-ui-font-family, system-ui, -apple-system, "Segoe UI", sans-serif);
  font-size: var(--jp-ui-font-size1, 13px);
  color: var(--jp-ui-font-color1, #222);
}
.nbdebug-run .nbd-run-summary { font-weight: 700; font-size: 1.08em; margin: 2px 0 6px; overflow-wrap: anywhere; }
.nbdebug-run code { font-family: var(--jp-code-font-family, ui-monospace, Menlo, Consolas, monospace); }
.nbdebug-run .nbd-run-bar { display: flex; flex-wrap: wrap; align-items: center; gap: 4px 10px; margin: 4px 0; }
.nbdebug-run .nbd-run-selector { display: flex; flex-wrap: wrap; gap: 4px; align-items: center; }
.nbdebug-run .nbd-run-label { color: var(--nbd-run-fg2); margin-right: 2px; }
.nbdebug-run .nbd-rank-btn {
  font: inherit; padding: 1px 8px; border: 1px solid var(--nbd-run-border); border-radius: 4px;
  background: var(--jp-layout-color1, #fff); color: inherit; cursor: pointer; display: inline-flex; gap: 4px; align-items: center;
}
.nbdebug-run .nbd-rank-btn.nbd-rank-active { border-color: var(--nbd-run-accent); box-shadow: inset 0 0 0 1px var(--nbd-run-accent); font-weight: 600; }
.nbdebug-run .nbd-rank-btn.nbd-rank-loading { font-style: italic; border-style: dotted; }
.nbdebug-run .nbd-rank-btn:disabled { cursor: default; border-style: dashed; color: var(--nbd-run-fg2); }
.nbdebug-run .nbd-rank-mark { font-size: 0.8em; border-radius: 3px; padding: 0 3px; color: #fff; }
.nbdebug-run .nbd-rank-nan { background: #6a3d9a; }
.nbdebug-run .nbd-rank-error { background: #b30000; }
.nbdebug-run .nbd-rank-hooks { background: #8a4b00; }
.nbdebug-run .nbd-run-status { color: var(--nbd-run-fg2); }
.nbdebug-run .nbd-run-error-box { color: #b30000; }
.nbdebug-run .nbd-run-nonfinite, .nbdebug-run .nbd-run-errors > div {
  border: 1px solid #b30000; border-left-width: 4px; border-radius: 4px; padding: 4px 8px; margin: 4px 0;
}
.nbdebug-run .nbd-run-message { color: var(--nbd-run-fg2); }
.nbdebug-run .nbd-run-diverged { margin: 4px 0; }
.nbdebug-run .nbd-run-diverged ul { margin: 2px 0; padding-left: 1.4em; }
.nbdebug-run .nbd-run-diverged-head { color: #b30000; }
.nbdebug-run .nbd-run-buffers-head, .nbdebug-run .nbd-run-same { color: var(--nbd-run-fg2); }
.nbdebug-run .nbd-run-notes { margin: 0 0 4px; padding-left: 1.2em; color: var(--nbd-run-fg2); font-size: 0.92em; }
.nbdebug-run .nbd-link { cursor: pointer; text-decoration: underline dotted; color: var(--nbd-run-link); }
.nbdebug-run .nbd-run-nonfinite, .nbdebug-run .nbd-run-diverged, .nbdebug-run .nbd-run-errors { overflow-wrap: anywhere; }
.nbdebug-run pre { overflow-x: auto; white-space: pre-wrap; overflow-wrap: anywhere; font-size: 0.85em; }
.nbdebug-run .nbdebug-thermometer .nbd-row, .nbdebug-run .nbdebug-thermometer .nbd-head { grid-template-columns: var(--nbd-cols) 9.5em; min-width: 990px; }
.nbdebug-run .nbdebug-thermometer.nbd-timed .nbd-row, .nbdebug-run .nbdebug-thermometer.nbd-timed .nbd-head { min-width: 1110px; }
.nbdebug-run .nbd-spread-cell { white-space: nowrap; overflow: hidden; text-overflow: ellipsis; color: var(--nbd-run-fg2); }
.nbdebug-run .nbd-spread-cell.nbd-spread-differs { color: inherit; font-weight: 600; }
@container (max-width: 1000px) {
  .nbdebug-run .nbdebug-thermometer .nbd-row, .nbdebug-run .nbdebug-thermometer .nbd-head,
  .nbdebug-run .nbdebug-thermometer.nbd-timed .nbd-row, .nbdebug-run .nbdebug-thermometer.nbd-timed .nbd-head {
    grid-template-columns: var(--nbd-cols) minmax(4.6em, 1fr); min-width: 0;
  }
  .nbdebug-run .nbd-spread-cell { white-space: normal; overflow-wrap: anywhere; text-overflow: clip; }
}
`;
