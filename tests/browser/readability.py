"""Legibility checks measured in the browser from what is rendered: text contrast (WCAG AA) and
nothing clipped when the notebook is 800 px wide.

- :func:`low_contrast`: every visible element with its own text under a widget root, its computed
  text colour composited over the colours behind it (every ancestor's background, alpha and
  ``opacity`` applied, the page white at the bottom); returns those under 4.5:1.
- :func:`clipped`: elements whose content is cut off: sticking out past the widget's right edge (not
  inside a scrolling box), or text cut by ``overflow: hidden`` with no way to read it whole (a
  ``title`` or ``data-tip``: a hover tip shows it), and the widget itself wider than its output area.
- :func:`set_notebook_width`: resize the viewport so that the notebook panel is ``width`` px wide.

>>> assert low_contrast(page, ".nbdebug-attention") == []          # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

__all__ = ["clipped", "low_contrast", "set_notebook_width"]

_CONTRAST = """([rootSel, minimum]) => {
  const parse = (s) => {
    const m = /rgba?\\(([^)]+)\\)/.exec(s || '');
    if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(parseFloat);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, below) => {
    const a = top[3];
    return [0, 1, 2].map((i) => top[i] * a + below[i] * (1 - a)).concat([1]);
  };
  const lum = (c) => {
    const f = (v) => { v /= 255; return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
  };
  const ratio = (a, b) => { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
  const SKIP = new Set(['SCRIPT', 'STYLE', 'OPTION', 'SELECT', 'INPUT', 'TEXTAREA', 'BUTTON', 'CANVAS']);
  const bad = [];
  let checked = 0;
  for (const root of document.querySelectorAll(rootSel)) {
    for (const el of [root, ...root.querySelectorAll('*')]) {
      if (SKIP.has(el.tagName)) continue;
      const own = Array.from(el.childNodes).some((n) => n.nodeType === 3 && n.textContent.trim());
      if (!own || !el.getClientRects().length) continue;
      const cs = getComputedStyle(el);
      if (cs.visibility !== 'visible' || parseFloat(cs.fontSize) === 0) continue;
      // the colours behind the text, outermost first; opacity groups composite onto what is behind them
      const chain = [];
      for (let e = el; e; e = e.parentElement) chain.unshift(e);
      let bg = [255, 255, 255, 1];
      const groups = [];
      for (const e of chain) {
        const s = getComputedStyle(e);
        const op = parseFloat(s.opacity);
        if (op < 1) groups.push([bg, op]);
        const c = parse(s.backgroundColor);
        if (c && c[3] > 0) bg = over(c, bg);
      }
      let fg = over(parse(cs.color) || [0, 0, 0, 1], bg);
      for (let i = groups.length - 1; i >= 0; i--) {
        const [outer, op] = groups[i];
        fg = over([fg[0], fg[1], fg[2], op], outer);
        bg = over([bg[0], bg[1], bg[2], op], outer);
      }
      checked++;
      const r = ratio(fg, bg);
      if (r < minimum) bad.push({ text: el.textContent.trim().slice(0, 60), cls: String(el.className), ratio: Math.round(r * 100) / 100,
                                  fg: fg.slice(0, 3).map(Math.round), bg: bg.slice(0, 3).map(Math.round) });
    }
  }
  return { checked, bad };
}"""

_CLIPPED = """(rootSel) => {
  const out = [];
  const scrolls = (s) => s.overflowX === 'auto' || s.overflowX === 'scroll';
  for (const root of document.querySelectorAll(rootSel)) {
    if (!root.getClientRects().length) continue;
    const rr = root.getBoundingClientRect();
    const host = root.closest('.jp-OutputArea-output') || root.parentElement;
    const hr = host.getBoundingClientRect();
    if (rr.right > hr.right + 1) out.push({ what: 'widget wider than its output area', cls: String(root.className), right: rr.right, limit: hr.right });
    for (const el of root.querySelectorAll('*')) {
      if (!el.getClientRects().length) continue;
      const cs = getComputedStyle(el);
      if (cs.visibility !== 'visible' || cs.position === 'fixed') continue;
      let inScroll = false;
      for (let e = el.parentElement; e && e !== root.parentElement; e = e.parentElement) {
        if (scrolls(getComputedStyle(e))) { inScroll = true; break; }
      }
      const r = el.getBoundingClientRect();
      if (!inScroll && r.width > 0 && r.right > rr.right + 1)
        out.push({ what: 'past the right edge', cls: String(el.className), text: (el.textContent || '').trim().slice(0, 60), right: r.right, limit: rr.right });
      const cut = (cs.overflowX === 'hidden' || cs.overflowX === 'clip') && el.scrollWidth > el.clientWidth + 1;
      const cutY = (cs.overflowY === 'hidden' || cs.overflowY === 'clip') && el.scrollHeight > el.clientHeight + 1;
      if ((cut || cutY) && !el.hasAttribute('title') && !el.hasAttribute('data-tip') && (el.textContent || '').trim())
        out.push({ what: 'text cut with no way to read it whole', cls: String(el.className), text: (el.textContent || '').trim().slice(0, 60) });
    }
  }
  return out;
}"""


def low_contrast(page: Any, root_selector: str, minimum: float = 4.5) -> list[dict[str, Any]]:
    """Text elements under ``root_selector`` whose rendered contrast is below ``minimum``; fails if none was checked."""
    ans = page.evaluate(_CONTRAST, [root_selector, minimum])
    assert ans["checked"] > 0, f"no visible text under {root_selector!r}"
    return list(ans["bad"])


def clipped(page: Any, root_selector: str) -> list[dict[str, Any]]:
    """What is cut off under ``root_selector`` (see the module docstring); ``[]`` when nothing is."""
    return list(page.evaluate(_CLIPPED, root_selector))


def set_notebook_width(page: Any, width: int = 800) -> int:
    """Resize the viewport until the current notebook panel is ``width`` px wide; returns its width."""
    sel = ".jp-NotebookPanel"
    for _ in range(3):
        now = page.evaluate(f"document.querySelector('{sel}').getBoundingClientRect().width")
        if abs(now - width) <= 1:
            break
        vp = page.viewport_size or {"width": 1280, "height": 900}
        page.set_viewport_size({"width": int(vp["width"] + width - now), "height": vp["height"]})
        page.wait_for_function(
            f"Math.abs(document.querySelector('{sel}').getBoundingClientRect().width - {width}) <= 1", timeout=10_000
        )
    return round(page.evaluate(f"document.querySelector('{sel}').getBoundingClientRect().width"))
