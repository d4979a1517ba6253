"""Standalone HTML export of a widget: its ES module, synced state and precomputed answers inline.

The page runs the widget's own ``render()`` against a small in-page model implementing the
anywidget model API (``get``, ``set``, ``on``, ``off``, ``save_changes``, ``send``). Binary buffers
travel base64-encoded and become ``DataView`` objects again in the page; requests the browser would
send to the kernel are answered from a table computed before export (others fail with "not
available in the exported file"). Nothing is loaded from the network.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Sequence
from typing import Any

from ipywidgets.widgets.widget import _remove_buffers

from ._transport import error_text

__all__ = ["DEFAULT_EXPORT_BYTES", "build_page", "request_key"]

#: Default size budget of an exported file (bytes); precomputed answers past it are left out.
DEFAULT_EXPORT_BYTES = 20 * 2**20

# Fallback values of the JupyterLab theme variables the views use (light theme).
_CSS = """
:root {
  --jp-border-color1: #bdbdbd; --jp-border-color2: #e0e0e0; --jp-border-color3: #eeeeee;
  --jp-brand-color1: #1976d2; --jp-brand-color3: #bbdefb; --jp-error-color1: #d32f2f;
  --jp-layout-color1: #ffffff; --jp-layout-color2: #eeeeee;
  --jp-ui-font-color1: rgba(0,0,0,.87); --jp-ui-font-color2: rgba(0,0,0,.54); --jp-ui-font-color3: rgba(0,0,0,.38);
  --jp-ui-font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
  --jp-code-font-family: Menlo, Consolas, "DejaVu Sans Mono", monospace; --jp-ui-font-size1: 13px;
}
body { margin: 16px; background: var(--jp-layout-color1); color: var(--jp-ui-font-color1);
       font-family: var(--jp-ui-font-family); font-size: var(--jp-ui-font-size1); }
.nbdebug-export-note { color: var(--jp-ui-font-color2); margin: 0 0 8px; }
.nbdebug-export-error { color: var(--jp-error-color1); white-space: pre-wrap; }
"""

# The page's bootstrap (no model text is ever written as markup: everything goes through data).
_BOOT = r"""
const data = JSON.parse(document.getElementById("nbdebug-data").textContent);
const esm = JSON.parse(document.getElementById("nbdebug-esm").textContent);
const b64 = (s) => { const bin = atob(s); const u = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i); return new DataView(u.buffer); };
function canon(v) {
  if (Array.isArray(v)) return "[" + v.map(canon).join(",") + "]";
  if (v && typeof v === "object") return "{" + Object.keys(v).sort().map((k) => JSON.stringify(k) + ":" + canon(v[k])).join(",") + "}";
  return JSON.stringify(v === undefined ? null : v);
}
function putBuffers(state, paths, buffers) {
  paths.forEach((path, i) => { let o = state;
    for (let j = 0; j < path.length - 1; j++) o = o[path[j]];
    o[path[path.length - 1]] = b64(buffers[i]); });
  return state;
}
const answers = new Map(data.answers.map((a) => [a.key, a]));
class Model {
  constructor(state) { this.state = state; this.listeners = new Map(); }
  get(name) { return this.state[name]; }
  set(name, value) { this.state[name] = value; this.emit("change:" + name, this, value); this.emit("change", this); }
  on(event, cb) { if (!this.listeners.has(event)) this.listeners.set(event, new Set()); this.listeners.get(event).add(cb); }
  off(event, cb) {
    if (!event) { this.listeners.clear(); return; }
    if (!cb) { this.listeners.delete(event); return; }
    this.listeners.get(event)?.delete(cb);
  }
  emit(event, ...args) { for (const cb of [...(this.listeners.get(event) || [])]) cb(...args); }
  save_changes() {}
  send(content) {
    if (!content || content.type !== "request") return;
    const hit = answers.get(content.method + " " + canon(content.params || {}));
    const msg = hit ? { type: "response", id: content.id, ok: hit.ok, result: hit.result, arrays: hit.arrays, error: hit.error }
      : { type: "response", id: content.id, ok: false,
          error: `nbdebug: ${content.method} ${canon(content.params || {})} is not available in the exported file` };
    const bufs = hit ? (hit.buffers || []).map(b64) : [];
    setTimeout(() => this.emit("msg:custom", msg, bufs), 0);
  }
}
const el = document.getElementById("nbdebug-view");
try {
  const url = URL.createObjectURL(new Blob([esm], { type: "text/javascript" }));
  const mod = await import(url);
  URL.revokeObjectURL(url);
  let widget = mod.default;
  if (typeof widget === "function") widget = await widget();
  const model = new Model(putBuffers(data.state, data.buffer_paths, data.buffers));
  await widget.initialize?.({ model });
  await widget.render({ model, el });
} catch (err) {
  const box = document.createElement("div");
  box.className = "nbdebug-export-error";
  box.textContent = "nbdebug: the exported view failed to start: " + (err && err.stack || err);
  el.append(box);
  throw err;
}
"""


def _finite(value: Any) -> Any:
    """``value`` with NaN/Inf floats replaced by None (JSON.parse knows no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json_for_script(value: Any) -> str:
    """JSON safe inside a ``<script type="application/json">`` element (no ``</script>`` break-out)."""
    text = json.dumps(_finite(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def request_key(method: str, params: dict[str, Any]) -> str:
    """Lookup key of one request, identical to the page's ``method + " " + canon(params)``."""
    return method + " " + json.dumps(params, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 100_000 else f"{n:,} bytes"


def _b64(buf: Any) -> str:
    return base64.b64encode(bytes(buf)).decode("ascii")


def build_page(*, esm: str, state: dict[str, Any], answers: Sequence[tuple[str, dict[str, Any], Any]],
               title: str, max_bytes: int = DEFAULT_EXPORT_BYTES) -> tuple[str, list[str]]:
    """The standalone page and the list of requests left out to stay within ``max_bytes``.

    ``answers`` holds ``(method, params, answer)`` where ``answer`` is ``(content, buffers)`` from
    ``NBWidget.handle_request`` or an exception raised by it (sent back as ``ok: false``).
    """
    plain, paths, buffers = _remove_buffers(state)
    data: dict[str, Any] = {"state": plain, "buffer_paths": paths, "buffers": [_b64(b) for b in buffers],
                            "answers": []}
    used = len(esm.encode()) + len(_json_for_script(data).encode()) + len(_BOOT) + len(_CSS) + 4096
    omitted: list[str] = []
    for method, params, answer in answers:
        key = request_key(method, params)
        if isinstance(answer, BaseException):
            entry: dict[str, Any] = {"key": key, "ok": False, "error": error_text(answer)}
        else:
            content, bufs = answer
            entry = {"key": key, "ok": True, "result": content.get("result"), "arrays": content.get("arrays", {}),
                     "buffers": [_b64(b) for b in bufs]}
        size = len(_json_for_script(entry).encode()) + 1
        if used + size > max_bytes:
            omitted.append(key)
            continue
        used += size
        data["answers"].append(entry)
    note = ""
    if omitted:
        shown = ", ".join(omitted[:5]) + (" …" if len(omitted) > 5 else "")
        note = (f'<p class="nbdebug-export-note">{len(omitted)} of {len(answers)} precomputed answers were left '
                f"out to keep this file under {_size(max_bytes)} ({html.escape(shown)}); they show "
                f"“not available in the exported file”.</p>")
    page = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f'<p class="nbdebug-export-note">{html.escape(title)} · exported by nbdebug (static copy: no kernel)</p>'
        f'{note}<div id="nbdebug-view"></div>'
        f'<script type="application/json" id="nbdebug-data">{_json_for_script(data)}</script>'
        f'<script type="application/json" id="nbdebug-esm">{_json_for_script(esm)}</script>'
        f'<script type="module">{_BOOT}</script></body></html>\n'
    )
    return page, omitted
