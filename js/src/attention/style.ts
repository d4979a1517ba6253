// Styles of the attention view. Text colours are ≥ 4.5:1 on their backgrounds (WCAG AA, checked
// in the browser tier); grey marks are neutral (sinks are normal), the orange border is reserved
// for heads that stand out for this model.
import { LEGEND_CSS } from "../lib/legend";

export const OUTLIER = "#c2410c";

export const CSS = `
.nbdebug-attention { font: 12px/1.35 system-ui, sans-serif; color: #222; position: relative; max-width: 100%; }
.nbdebug-attention .nba-finding { font-weight: 700; margin: 2px 0; overflow-wrap: anywhere; }
.nbdebug-attention .nba-finding.nba-has-outliers { border-left: 4px solid ${OUTLIER}; padding-left: 6px; }
.nbdebug-attention .nba-summary { margin: 2px 0; overflow-wrap: anywhere; }
.nbdebug-attention .nba-detail .nba-summary { font-weight: 600; }
.nbdebug-attention .nba-neutral { color: #555; }
.nbdebug-attention .nba-path, .nbdebug-attention .nba-note { color: #555; overflow-wrap: anywhere; }
.nbdebug-attention .nba-details { margin: 2px 0 4px; }
.nbdebug-attention .nba-details summary { cursor: pointer; color: #444; }
.nbdebug-attention .nba-controls { display: flex; gap: 4px 12px; align-items: center; margin: 6px 0 2px; flex-wrap: wrap; }
.nbdebug-attention .nba-legend-row { display: flex; gap: 4px 14px; align-items: center; margin: 2px 0 4px; flex-wrap: wrap; }
.nbdebug-attention .nba-sw-outlier { border: 2px solid ${OUTLIER}; background: #fff4ec; }
.nbdebug-attention .nba-sw-sink { border: 2px dashed #8c8c8c; }
.nbdebug-attention .nba-sw-uniform { border: 2px dotted #8c8c8c; }
.nbdebug-attention .nba-grid { display: grid; gap: 3px; overflow-x: auto; max-width: 100%; align-items: start; justify-content: start; }
.nbdebug-attention .nba-rowlabel, .nbdebug-attention .nba-collabel { color: #555; font-size: 10px; text-align: center; align-self: center; }
.nbdebug-attention .nba-head { border: 2px solid transparent; cursor: pointer; text-align: center; padding: 1px; }
.nbdebug-attention .nba-head canvas { width: 48px; height: 48px; image-rendering: pixelated; display: block; margin: auto; }
.nbdebug-attention .nba-head .nba-val { font-size: 10px; color: #444; max-width: 56px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.nbdebug-attention .nba-head.nba-sink { border: 2px dashed #8c8c8c; }
.nbdebug-attention .nba-head.nba-uniform { border: 2px dotted #8c8c8c; }
.nbdebug-attention .nba-head.nba-outlier { border: 2px solid ${OUTLIER}; background: #fff4ec; }
.nbdebug-attention .nba-head.nba-outlier .nba-val { font-weight: 700; color: #9a3412; white-space: normal; overflow: visible; text-overflow: clip; overflow-wrap: anywhere; text-align: center; }  /* the reason whole, on two lines if need be */
.nbdebug-attention .nba-head.nba-selected { outline: 2px solid #1f77b4; }
.nbdebug-attention .nba-why { color: #9a3412; font-weight: 700; overflow-wrap: anywhere; }
.nbdebug-attention .nba-peek { position: absolute; z-index: 20; background: #fff; border: 1px solid #767676; padding: 6px;
  box-shadow: 0 2px 6px rgba(0,0,0,.2); pointer-events: none; font-size: 10px; color: #222; max-width: 340px; }
.nbdebug-attention .nba-peek-title { font-weight: 600; font-size: 11px; }
.nbdebug-attention .nba-peek-why { color: #9a3412; font-weight: 700; max-width: 320px; }
.nbdebug-attention .nba-peek-body { display: grid; grid-template-columns: 112px 160px; margin-top: 4px; }
.nbdebug-attention .nba-peek-map { image-rendering: pixelated; display: block; }
.nbdebug-attention .nba-peek-ylabels, .nbdebug-attention .nba-peek-xlabels { position: relative; font-family: ui-monospace, monospace; }
.nbdebug-attention .nba-peek-xlabels { height: 84px; }
.nbdebug-attention .nba-peek-y { position: absolute; right: 4px; transform: translateY(-50%); max-width: 106px; line-height: 12px;
  white-space: pre; overflow: hidden; text-overflow: ellipsis; }
.nbdebug-attention .nba-peek-x { position: absolute; top: 3px; writing-mode: vertical-rl; transform: translateX(-50%); max-height: 80px;
  line-height: 12px; white-space: pre; overflow: hidden; text-overflow: ellipsis; }
.nbdebug-attention .nba-peek-at { min-height: 14px; font-family: ui-monospace, monospace; white-space: pre-wrap; overflow-wrap: anywhere; }
.nbdebug-attention .nba-detail { margin-top: 8px; border-top: 1px solid #ddd; padding-top: 6px; }
.nbdebug-attention .nba-actions { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; margin: 4px 0; }
.nbdebug-attention .nba-views { display: flex; gap: 16px; align-items: flex-start; flex-wrap: wrap; }
.nbdebug-attention .nba-matrix-box { max-width: 100%; }
.nbdebug-attention .nba-matrix { image-rendering: pixelated; border: 1px solid #ccc; cursor: crosshair; max-width: 100%; height: auto !important; aspect-ratio: 1; }
.nbdebug-attention .nba-lines { position: relative; display: flex; max-width: 100%; }
.nbdebug-attention .nba-tok { height: 16px; line-height: 16px; white-space: pre; font-family: ui-monospace, monospace;
  font-size: 11px; padding: 0 4px; cursor: default; max-width: 140px; overflow: hidden; text-overflow: ellipsis; }
.nbdebug-attention .nba-left .nba-tok { text-align: right; }
.nbdebug-attention .nba-tok.nba-hot { background: #ffe9a8; }
.nbdebug-attention .nba-tok.nba-mark { background: #cfe3ff; font-weight: 600; }
.nbdebug-attention .nba-highlight { color: #1f4e99; min-height: 16px; }
.nbdebug-attention .nba-status { color: #333; min-height: 16px; font-family: ui-monospace, monospace; white-space: pre-wrap; overflow-wrap: anywhere; }
.nbdebug-attention .nba-error { color: #b00; }
.nbdebug-attention .nba-tok.nba-gen { color: #6d28d9; font-style: italic; }
${LEGEND_CSS}
`;
