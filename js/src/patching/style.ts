// Styles of the patching view. Cell text colours come from textOn (≥ 4.5:1 on every cell colour);
// other text is #222–#555 on white.
export const CSS = `
.nbdebug-patching { font: 12px/1.35 system-ui, sans-serif; color: #222; max-width: 100%; }
.nbdebug-patching .nbp-title, .nbdebug-patching .nbd-headline { font-weight: 700; margin: 2px 0; overflow-wrap: anywhere; }
.nbdebug-patching .nbp-sub, .nbdebug-patching .nbp-note, .nbdebug-patching .nbp-status { color: #555; margin: 2px 0; overflow-wrap: anywhere; }
.nbdebug-patching .nbp-error { color: #b00020; }
.nbdebug-patching .nbp-controls { display: flex; gap: 4px 14px; align-items: center; margin: 6px 0; flex-wrap: wrap; }
.nbdebug-patching .nbp-colourbar { display: flex; gap: 6px; align-items: center; }
.nbdebug-patching .nbp-bar { width: 160px; height: 10px; display: block; border: 1px solid #999; }
.nbdebug-patching .nbp-ticks { display: flex; justify-content: space-between; width: 162px; color: #444; font-size: 10px; }
.nbdebug-patching .nbp-grid { display: grid; gap: 1px; max-width: 100%; justify-content: start; }
.nbdebug-patching .nbp-rowlabel { color: #444; font-size: 10px; padding-right: 4px; text-align: right; white-space: nowrap; align-self: center; }
.nbdebug-patching .nbp-collabel { color: #444; font-size: 10px; text-align: center; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; max-width: 56px; }
.nbdebug-patching .nbp-cell { min-width: 40px; height: 20px; font-size: 10px; text-align: center; line-height: 20px; cursor: pointer; border: 2px solid transparent; box-sizing: border-box; }
.nbdebug-patching .nbp-cell.nbp-verified { border: 2px solid #111; }
.nbdebug-patching .nbp-cell.nbp-selected { outline: 2px solid #e8590c; outline-offset: -1px; }
.nbdebug-patching .nbp-cell.nbp-same { cursor: default; }
.nbdebug-patching .nbp-tip { color: #222; min-height: 1.4em; margin: 4px 0; overflow-wrap: anywhere; }
.nbdebug-patching .nbp-tops { display: flex; gap: 18px; flex-wrap: wrap; margin-top: 6px; }
.nbdebug-patching .nbp-top h4 { margin: 0 0 2px; font-size: 12px; }
.nbdebug-patching .nbp-top table { border-collapse: collapse; }
.nbdebug-patching .nbp-top td { padding: 0 6px 0 0; font-family: monospace; }
.nbdebug-patching .nbp-top td.nbp-p { color: #444; text-align: right; }
.nbdebug-patching .nbp-top tr.nbp-answer td { border-top: 1px solid #999; }
.nbdebug-patching .nbp-top tr.nbp-is-answer td { font-weight: 700; }
.nbdebug-patching .nbp-top.nbp-patched h4 { color: #a3440a; }
.nbdebug-patching .nbp-lens { margin-top: 6px; }
.nbdebug-patching .nbp-lens h4 { margin: 0 0 2px; font-size: 12px; }
.nbdebug-patching .nbp-lens table { border-collapse: collapse; }
.nbdebug-patching .nbp-lens td { padding: 0 6px 0 0; font-family: monospace; }
.nbdebug-patching .nbp-lens td.nbp-p { color: #444; text-align: right; }
.nbdebug-patching .nbp-lens th { font-weight: normal; color: #444; text-align: left; padding: 0 6px 0 0; font-size: 11px; }
.nbdebug-patching .nbp-lens th.nbp-lens-row { text-align: right; white-space: nowrap; }
.nbdebug-patching .nbp-lens td.nbp-lens-patched { color: #a3440a; }
.nbdebug-patching .nbp-lens td.nbp-lens-tok { white-space: pre; max-width: 160px; overflow: hidden; text-overflow: ellipsis; }
`;
