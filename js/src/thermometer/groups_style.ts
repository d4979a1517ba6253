// Styles of the grouped thermometer (js/src/thermometer/groups.ts), scoped under .nbd-groups;
// JupyterLab theme variables with fallbacks (light and dark themes, and outside JupyterLab).

export const GROUPS_CSS = `
.nbd-groups {
  --nbd-g-fg2: var(--jp-ui-font-color2, #666);
  --nbd-g-bg2: var(--jp-layout-color2, rgba(127,127,127,0.08));
  --nbd-g-border: var(--jp-border-color2, rgba(127,127,127,0.3));
  --nbd-g-select: var(--jp-brand-color3, rgba(25,118,210,0.18));
  font-family: var(--jp-ui-font-family, system-ui, -apple-system, "Segoe UI", sans-serif);
  font-size: var(--jp-ui-font-size1, 13px);
  line-height: 1.35;
}
.nbd-groups .nbd-group-controls { display: flex; flex-wrap: wrap; gap: 4px 12px; align-items: center; margin: 4px 0; }
.nbd-groups .nbd-group-filter { min-width: 18em; padding: 1px 4px; }
.nbd-groups .nbd-group-count, .nbd-groups .nbd-gcount, .nbd-groups .nbd-gnote, .nbd-groups .nbd-gmatch,
.nbd-groups .nbd-group-more, .nbd-groups .nbd-group-none { color: var(--nbd-g-fg2); font-size: 0.92em; }
.nbd-groups .nbd-gnote.nbd-bad { color: #b30000; }
.nbd-groups .nbd-group-list { max-height: 36em; overflow: auto; border-top: 1px solid var(--nbd-g-border); }
.nbd-groups .nbd-grp, .nbd-groups .nbd-blk, .nbd-groups .nbd-grow {
  display: flex; align-items: center; gap: 8px; padding: 1px 4px; min-height: 1.6em;
  border-bottom: 1px solid var(--nbd-g-border); cursor: pointer; white-space: nowrap;
}
.nbd-groups .nbd-grp { font-weight: 600; background: var(--nbd-g-bg2); }
.nbd-groups .nbd-grp:hover, .nbd-groups .nbd-blk:hover, .nbd-groups .nbd-grow:hover { background: var(--nbd-g-select); }
.nbd-groups .nbd-grow.nbd-selected { background: var(--nbd-g-select); outline: 1px solid var(--jp-brand-color1, #1976d2); }
.nbd-groups .nbd-grow.nbd-flagged { box-shadow: inset 3px 0 0 #d62728; }
.nbd-groups .nbd-toggle { display: inline-block; width: 1em; transition: transform 0.1s; color: var(--nbd-g-fg2); }
.nbd-groups .nbd-open > .nbd-toggle { transform: rotate(90deg); }
.nbd-groups .nbd-gname { min-width: 12em; overflow: hidden; text-overflow: ellipsis;
  font-family: var(--jp-code-font-family, ui-monospace, Menlo, Consolas, monospace); }
.nbd-groups .nbd-gtype { min-width: 7em; color: var(--nbd-g-fg2); overflow: hidden; text-overflow: ellipsis; }
.nbd-groups .nbd-gstat { min-width: 8em; font-variant-numeric: tabular-nums; }
.nbd-groups .nbd-gflags { display: inline-flex; gap: 3px; }
.nbd-groups .nbd-chip { border: 1px solid var(--nbd-chip, #888); color: var(--nbd-chip, #888); border-radius: 8px;
  padding: 0 5px; font-size: 0.85em; font-weight: 400; }
.nbd-groups .nbd-strip { display: inline-flex; height: 1.1em; border: 1px solid var(--nbd-g-border); }
.nbd-groups .nbd-cell { display: inline-block; width: 7px; height: 100%; }
.nbd-groups .nbd-cell-nan { background: repeating-linear-gradient(45deg, transparent 0 2px, rgba(127,127,127,0.5) 2px 3px); }
.nbd-groups .nbd-cell-flagged { box-shadow: inset 0 -2px 0 #d62728; }
.nbd-groups .nbd-cell:hover { outline: 1px solid var(--jp-ui-font-color0, #000); }
.nbd-groups svg.nbd-gspark { display: inline-block; overflow: visible; flex: none; }
.nbd-groups .nbd-gspark .nbd-spark-line { fill: none; stroke: var(--jp-brand-color1, #1976d2); stroke-width: 1.2; }
.nbd-groups .nbd-gspark .nbd-spark-band { fill: none; stroke: var(--jp-brand-color1, #1976d2); stroke-opacity: 0.3; }
.nbd-groups .nbd-swatch { display: inline-block; width: 0.9em; height: 0.9em; border: 1px solid var(--nbd-g-border); }
`;
