// Styles of the lens view. Text colours are ≥ 4.5:1 on their backgrounds (WCAG AA, checked in the
// browser tier); cells wrap nothing and truncate long tokens, whose whole text the hover tip shows.
import { LEGEND_CSS } from "../lib/legend";

export const CSS = `
.nbdebug-logitlens { font: 12px/1.35 system-ui, sans-serif; color: #222; position: relative; max-width: 100%; }
.nbdebug-logitlens .nbl-finding { font-weight: 700; margin: 2px 0; border-left: 4px solid #1f4e99; padding-left: 6px; overflow-wrap: anywhere; }
.nbdebug-logitlens .nbl-title { font-weight: 600; }
.nbdebug-logitlens .nbl-note { color: #555; overflow-wrap: anywhere; }
.nbdebug-logitlens .nbl-details { margin: 2px 0 4px; }
.nbdebug-logitlens .nbl-details summary { cursor: pointer; color: #444; }
.nbdebug-logitlens .nbl-controls { display: flex; gap: 4px 12px; align-items: center; margin: 6px 0 2px; flex-wrap: wrap; }
.nbdebug-logitlens .nbl-controls input[type=number] { width: 4.5em; }
.nbdebug-logitlens .nbl-legend-row { display: flex; gap: 4px 16px; align-items: center; margin: 2px 0 6px; flex-wrap: wrap; }
.nbdebug-logitlens .nbl-sample { font-family: ui-monospace, monospace; font-size: 11px; padding: 0 3px; background: #fff; color: #222; }
.nbdebug-logitlens .nbl-sw-pinned { outline: 2px solid #d62728; outline-offset: -2px; background: #fff; }
.nbdebug-logitlens .nbl-main { display: flex; gap: 10px; align-items: flex-start; max-width: 100%; }
.nbdebug-logitlens .nbl-side:empty { display: none; }
.nbdebug-logitlens .nbl-side { flex: 0 0 auto; max-width: 40%; border-left: 1px solid #ddd; padding-left: 8px; }
.nbdebug-logitlens .nbl-wrapcol { max-width: 100%; flex: 1 1 auto; min-width: 0; }
.nbdebug-logitlens .nbl-wrap { overflow: auto; max-height: 620px; max-width: 100%; }
.nbdebug-logitlens table { border-collapse: collapse; font-family: ui-monospace, monospace; font-size: 11px; }
.nbdebug-logitlens th { font-weight: normal; color: #333; padding: 1px 3px; white-space: pre; position: sticky; top: 0; background: #fff; max-width: 120px; overflow: hidden; text-overflow: ellipsis; }
.nbdebug-logitlens th.nbl-row { position: sticky; left: 0; text-align: right; z-index: 1; }
.nbdebug-logitlens td { padding: 1px 3px; white-space: pre; max-width: 120px; overflow: hidden; text-overflow: ellipsis; border: 1px solid #fff; cursor: pointer; }
.nbdebug-logitlens .nbl-target { font-weight: 700; text-decoration: underline; }
.nbdebug-logitlens .nbl-onset { box-shadow: inset 0 0 0 2px #000, inset 0 0 0 4px #fff; }
.nbdebug-logitlens td.nbl-pinned { outline: 2px solid #d62728; outline-offset: -2px; }
.nbdebug-logitlens td.nbl-pending { color: #555; }
.nbdebug-logitlens .nbl-tip { position: absolute; z-index: 10; background: #fff; color: #222; border: 1px solid #767676; padding: 4px 6px;
  box-shadow: 0 2px 6px rgba(0,0,0,.2); pointer-events: none; font-family: ui-monospace, monospace; white-space: pre-wrap; overflow-wrap: anywhere; max-width: min(480px, calc(100% - 8px)); }
.nbdebug-logitlens .nbl-pins { display: flex; gap: 12px; flex-wrap: wrap; margin-top: 6px; }
.nbdebug-logitlens .nbl-pin { border: 1px solid #ddd; padding: 4px 6px; font-family: ui-monospace, monospace; white-space: pre; }
.nbdebug-logitlens .nbl-error { color: #b00; }
.nbdebug-logitlens th.nbl-gen { color: #6d28d9; font-style: italic; border-bottom: 2px solid #6d28d9; }
.nbdebug-logitlens .nbl-steer { border: 1px solid #ddd; padding: 2px 6px; margin: 4px 0; }
.nbdebug-logitlens .nbl-steer-slider { width: 180px; vertical-align: middle; }
.nbdebug-logitlens .nbl-steer-tops { display: flex; gap: 18px; flex-wrap: wrap; }
.nbdebug-logitlens .nbl-steer-top td { font-family: ui-monospace, monospace; padding: 0 6px 0 0; white-space: pre; }
.nbdebug-logitlens .nbl-steer-p { color: #444; text-align: right; }
.nbdebug-logitlens tr.nbl-embed td, .nbdebug-logitlens tr.nbl-embed th { color: #595959 !important; font-style: italic; }
.nbdebug-logitlens .nbl-bylayer td, .nbdebug-logitlens .nbl-bylayer th { cursor: default; border: 0; padding: 0 5px; position: static; }
.nbdebug-logitlens .nbl-bylayer .nbl-num { text-align: right; }
.nbdebug-logitlens .nbl-bylayer .nbl-diff { font-weight: 700; text-decoration: underline; }
.nbdebug-logitlens .nbl-side { max-width: 48%; overflow-x: auto; }
${LEGEND_CSS}
`;
