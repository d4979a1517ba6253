"""Legibility checks measured in the browser (issue 22): text contrast from the rendered colours, and
nothing cut in a narrow notebook.

- :func:`contrast_failures`: every visible text node under a root, its computed colour against its
  *effective* background (the ancestors' background colours composited over the page's, opacity
  folded into the text's alpha), held to WCAG AA 4.5:1. ``<details>`` are opened first, so text a
  click would show is measured too. Colours are parsed from the computed style (``rgb()``,
  ``rgba()`` and ``color(srgb …)``, what ``color-mix()`` computes to); an independent implementation,
  not the views' own ``lib/contrast.ts``.
- :func:`clipped`: every rendered element under a root that holds text and whose content is wider
  than its box while it does not show overflow (``overflow-x`` hidden/clip/auto/scroll, or an
  ellipsis): text cut or only reachable by scrolling sideways. Also the root itself wider than the
  notebook's output area.
- :func:`narrow`: an 800-px-wide window with JupyterLab's side panels collapsed (the notebook is
  then narrower than 800 px: a stricter test than an 800-px notebook).
"""

from __future__ import annotations

from typing import Any

from .harness import run_js

__all__ = ["AA", "clipped", "contrast_failures", "narrow"]

AA = 4.5

_CONTRAST = r"""(arg) => {
  const [sel, minimum] = arg;
  const parse = (c) => {
    if (!c) return null;
    let m = c.match(/^rgba?\(([^)]+)\)$/);
    if (m) {
      const p = m[1].split(/[\s,\/]+/).filter(Boolean).map(Number);
      return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    }
    m = c.match(/^color\(srgb\s+([^)]+)\)$/);
    if (m) {
      const p = m[1].split(/[\s\/]+/).filter(Boolean).map(Number);
      return [p[0] * 255, p[1] * 255, p[2] * 255, p.length > 3 ? p[3] : 1];
    }
    return null;
  };
  const over = (top, bottom) => [0, 1, 2].map((i) => top[i] * top[3] + bottom[i] * (1 - top[3])).concat(1);
  const lum = (c) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
  };
  const ratio = (a, b) => { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
  const roots = [...document.querySelectorAll(sel)];
  for (const r of roots) for (const d of r.querySelectorAll('details')) d.open = true;
  const page = parse(getComputedStyle(document.body).backgroundColor) || [255, 255, 255, 1];
  const base = page[3] > 0 ? over(page, [255, 255, 255, 1]) : [255, 255, 255, 1];
  const out = [];
  let checked = 0;
  for (const root of roots) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      const text = n.textContent.trim();
      const el = n.parentElement;
      if (!text || !el || el.closest('style, script, option, title, select')) continue;
      const range = document.createRange();
      range.selectNodeContents(n);
      const rects = [...range.getClientRects()].filter((q) => q.width > 0 && q.height > 0);
      if (!rects.length) continue;
      const cs = getComputedStyle(el);
      if (cs.visibility !== 'visible') continue;
      const chain = [];
      for (let a = el; a; a = a.parentElement) chain.unshift(a);
      let bg = base, alpha = 1;
      for (const a of chain) {
        const s = getComputedStyle(a);
        alpha *= Number(s.opacity);
        const c = parse(s.backgroundColor);
        if (c && c[3] > 0) bg = over(c, bg);
      }
      const fg = parse(cs.color);
      if (!fg) { out.push({ text: text.slice(0, 60), color: cs.color, why: 'unparsed colour' }); continue; }
      const shown = over([fg[0], fg[1], fg[2], fg[3] * alpha], bg);
      const r = ratio(shown, bg);
      checked++;
      if (r < minimum) out.push({ text: text.slice(0, 60), cls: el.className && String(el.className), color: cs.color,
                                  background: 'rgb(' + bg.slice(0, 3).map(Math.round).join(',') + ')', ratio: Math.round(r * 100) / 100 });
    }
  }
  return { checked, failures: out };
}"""

_CLIPPED = r"""(sel) => {
  const out = [];
  let checked = 0;
  for (const root of document.querySelectorAll(sel)) {
    for (const d of root.querySelectorAll('details')) d.open = true;
    const area = root.closest('.jp-OutputArea-output, .jp-Cell-outputArea, .jp-OutputArea') || root.parentElement;
    const rr = root.getBoundingClientRect(), ar = area.getBoundingClientRect();
    if (rr.right > ar.right + 1) out.push({ what: 'the view is wider than its output area', right: rr.right, area: ar.right });
    for (const el of [root, ...root.querySelectorAll('*')]) {
      if (!(el instanceof HTMLElement) || !el.getClientRects().length) continue;
      if (!el.textContent.trim()) continue;
      const cs = getComputedStyle(el);
      if (cs.display === 'none' || cs.visibility !== 'visible') continue;
      checked++;
      const hides = cs.overflowX !== 'visible' || cs.textOverflow === 'ellipsis';
      if (hides && el.scrollWidth > el.clientWidth + 1) {
        out.push({ cls: String(el.className), text: el.textContent.trim().slice(0, 60), overflowX: cs.overflowX,
                   scrollWidth: el.scrollWidth, clientWidth: el.clientWidth });
      }
    }
  }
  return { checked, failures: out };
}"""


def contrast_failures(page: Any, selector: str, minimum: float = AA) -> tuple[int, list[dict[str, Any]]]:
    """``(text nodes measured, those below ``minimum``:1)`` under every element matching ``selector``."""
    res = page.evaluate(_CONTRAST, [selector, minimum])
    return int(res["checked"]), list(res["failures"])


def clipped(page: Any, selector: str) -> tuple[int, list[dict[str, Any]]]:
    """``(elements with text measured, those whose text is cut)`` under ``selector`` (see the module doc)."""
    res = page.evaluate(_CLIPPED, selector)
    return int(res["checked"]), list(res["failures"])


def narrow(page: Any, width: int = 800, height: int = 900) -> int:
    """Make the window ``width`` px wide and collapse JupyterLab's side panels (Notebook 7 has none
    open); returns the notebook panel's width in px (≤ ``width``). The panels' state before is kept in
    ``window.__nbdebugNarrowed``: the reused Lab page (``labpage.py``) reopens them after the test."""
    page.set_viewport_size({"width": width, "height": height})
    return int(run_js(page, """
        // what the panels were before the first narrow(): a reused Lab page (labpage.py) opens them again
        if (!window.__nbdebugNarrowed) window.__nbdebugNarrowed = [!!app.shell.leftCollapsed, !!app.shell.rightCollapsed];
        if (app.shell.collapseLeft) app.shell.collapseLeft();
        if (app.shell.collapseRight) app.shell.collapseRight();
        await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
        const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)') || document.querySelector('.jp-Notebook');
        return nb ? Math.round(nb.getBoundingClientRect().width) : 0;
    """))
