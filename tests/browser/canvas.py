"""Canvas checks of the real-browser tier (re-exported by ``harness.py``): how many pixels of a canvas
differ from its background, read with ``getImageData``."""

from __future__ import annotations

from typing import Any

from .servers import POLL_MS, WIDGET_MS

_CANVAS_COUNT = """([sel, bg]) => {
    const el = document.querySelector(sel);
    if (!el) return -1;
    const c = el.tagName === 'CANVAS' ? el : el.querySelector('canvas');
    if (!c) return -1;
    if (!c.width || !c.height) return 0;
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    const n = d.length / 4;
    const px = new Uint32Array(d.buffer, d.byteOffset, n);
    let ref = 0;
    if (bg === null) {
        const counts = new Map();
        let best = -1;
        for (let i = 0; i < n; i++) counts.set(px[i], (counts.get(px[i]) || 0) + 1);
        for (const [k, v] of counts) if (v > best) { best = v; ref = k; }
    } else {
        ref = new Uint32Array(new Uint8Array(bg).buffer)[0];
    }
    let count = 0;
    for (let i = 0; i < n; i++) if (px[i] !== ref) count++;
    return count;
}"""


def canvas_nonblank(
    page: Any, selector: str, background: tuple[int, int, int, int] | None = None
) -> int:
    """Number of pixels of the canvas that differ from the background (via ``getImageData``).

    ``selector`` is CSS for the canvas (or an element containing one); the first match is used.
    ``background`` is an RGBA tuple; by default the most frequent pixel value is the background.
    """
    bg = list(background) if background is not None else None
    count = int(page.evaluate(_CANVAS_COUNT, [selector, bg]))
    if count < 0:
        raise AssertionError(f"no canvas matches {selector!r}")
    return count


def wait_canvas_nonblank(
    page: Any,
    selector: str,
    minimum: int = 1,
    background: tuple[int, int, int, int] | None = None,
    timeout: int = WIDGET_MS,
) -> int:
    """Wait until the canvas has at least ``minimum`` non-background pixels; returns the count."""
    bg = list(background) if background is not None else None
    page.wait_for_function(
        f"(args) => ({_CANVAS_COUNT})(args) >= {int(minimum)}", arg=[selector, bg], timeout=timeout,
        polling=POLL_MS,
    )
    return canvas_nonblank(page, selector, background)
