"""Static snapshots for saved notebooks: a tiny PNG encoder and colormap lookup tables.

Where the live widget cannot render (nbviewer, GitHub, an untrusted notebook, nbconvert HTML) the
output's ``text/html`` is a self-contained snapshot: HTML without scripts and PNG pictures inlined as
``data:`` URIs. Only numpy and zlib are needed (no matplotlib, no PIL).

>>> uri = png_data_uri(colorize(np.arange(256, dtype=np.uint8).reshape(16, 16), "viridis"))
>>> uri.startswith("data:image/png;base64,")
True
"""

from __future__ import annotations

import base64
import html
import struct
import zlib

import numpy as np

__all__ = ["MAX_SNAPSHOT_BYTES", "code_html", "colorize", "css_color", "encode_png", "grid", "img_tag", "lut",
           "png_data_uri", "upscale"]

def code_html(text: str) -> str:
    """Escaped ``text`` with its backticked names as ``<code>`` (a module, layer or run name): the one way
    every static page writes them, as js/src/lib/dom.ts ``withCode`` does in the live views.

    >>> code_html("`lr=3.0` spikes at <b>")
    '<code>lr=3.0</code> spikes at &lt;b&gt;'
    """
    parts = html.escape(str(text)).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


#: Default size budget of one view's static snapshot (bytes of HTML).
MAX_SNAPSHOT_BYTES = 200_000

# Evenly spaced control points, "rrggbb" concatenated (the same tables as js/src/lib/colormap.ts).
_CONTROL: dict[str, str] = {
    "viridis": (
        "44015446085c471063481769481d6f482475472a7a46307e453781433d844142873f48893d4e8a3a538b38598c355e8d"
        "33638d31688e2e6d8e2c718e2a768e297b8e27808e25848e23898e218e8d20928c1f978b1e9c891fa18821a58524aa83"
        "28ae802eb37c35b7793dbc7446c06f50c46a5ac86465cb5e70cf577cd25089d54895d840a2da37b0dd2fbddf26cae11f"
        "d8e219e5e419f1e51dfde725"
    ),
    "magma": (
        "00000402020b0504160907200e0b2b140e361a104221114e29115a311165390f6e420f754a107952137c5a167e621980"
        "6a1c81721f81792282812581892881912b81992d80a1307eaa337db2357bba3878c23b75ca3e72d2426fd9466be04c67"
        "e75263ec5860f1605df4695cf7725cf97b5dfb8560fc8e64fd9869fea16efeaa74feb47bfebd82fec68afecf92fed89a"
        "fde2a3fdebacfcf4b6fcfdbf"
    ),
    "inferno": (
        "00000402020c0504170a072210092d160b391e0c45260c512f0a5b380962400a67490b6a510e6c59106e61136e69166e"
        "71196e781c6d801f6c88226a902568982766a02a63a82e5fb0315bb73557bf3952c63d4dcc4248d34743d94d3ddf5337"
        "e45a31e9612bed6925f1711ff47918f78212f98b0bfa9407fb9d07fca60cfcb014fbba1ffac42af8cd37f6d746f4e156"
        "f2ea69f2f27df5f992fcffa4"
    ),
    "plasma": (
        "0d08871b068d2605912f059638049a41049d4903a05102a35901a56100a76900a87100a87801a88004a88707a68e0ca4"
        "9511a19c179ea21d9aa82296ae2892b42e8dba3388bf3984c43e7fc9447acd4a76d24f71d6556dda5b69de6164e26660"
        "e66c5ce97257ed7953f07f4ff3854bf58c46f79342f99a3efba139fca835fdaf31feb72dfebe2afdc627fcce25fbd724"
        "f8df25f6e826f3f027f0f921"
    ),
    "gray": (
        "000000ffffff"
    ),
    "coolwarm": (
        "3b4cc04055c8465ecf4c66d6536edd5977e35f7fe86687ed6c8ff17396f57a9df881a4fb88abfd8fb1fe96b7ff9dbdff"
        "a3c2feaac7fdb1cbfcb7cff9bed2f6c4d5f3cad8efcfdaead5dbe5dadce0dfdbd9e4d9d2e9d5cbedd2c3f0cdbbf2c9b4"
        "f5c4acf6bea4f7b89cf7b194f7aa8cf6a385f59c7df39475f08b6eed8366e97a5fe57058e16751dc5d4ad65244d0473d"
        "ca3b37c32e31bb1b2cb40426"
    ),
    "RdBu": (
        "67001fb2182bd6604df4a582fddbc7f7f7f7d1e5f092c5de4393c32166ac053061"
    ),
}

_LUTS: dict[str, np.ndarray] = {}


def lut(name: str) -> np.ndarray:
    """256×3 uint8 lookup table of colormap ``name`` (unknown names fall back to viridis)."""
    key = name if name in _CONTROL else "viridis"
    table = _LUTS.get(key)
    if table is None:
        hexs = _CONTROL[key]
        pts = np.array([[int(hexs[i + j : i + j + 2], 16) for j in (0, 2, 4)] for i in range(0, len(hexs), 6)],
                       dtype=np.float64)
        n = len(pts)
        pos = np.arange(256) / 255 * (n - 1)
        k = np.minimum(np.floor(pos).astype(int), n - 2)
        f = (pos - k)[:, None]
        # round half up like the JS table (Math.round)
        table = np.floor(pts[k] * (1 - f) + pts[k + 1] * f + 0.5).astype(np.uint8)
        _LUTS[key] = table
    return table


def colorize(u8: np.ndarray, name: str) -> np.ndarray:
    """Map uint8 values (any shape) through colormap ``name``: shape + (3,) uint8 RGB."""
    return lut(name)[np.asarray(u8, dtype=np.uint8)]


def css_color(name: str, t: float) -> str:
    """``rgb(r,g,b)`` of colormap ``name`` at ``t`` in [0, 1] (NaN gives the t = 0 colour)."""
    x = 0.0 if not np.isfinite(t) else min(1.0, max(0.0, float(t)))
    r, g, b = lut(name)[round(x * 255)]
    return f"rgb({r},{g},{b})"


def encode_png(img: np.ndarray) -> bytes:
    """PNG bytes of a uint8 image: H×W (grey), H×W×3 (RGB) or H×W×4 (RGBA)."""
    a = np.asarray(img)
    if a.dtype != np.uint8:
        raise TypeError(f"encode_png needs uint8 pixels, got {a.dtype}")
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3 or a.shape[2] not in (1, 3, 4) or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"encode_png needs H×W, H×W×3 or H×W×4 pixels, got shape {a.shape}")
    h, w, c = a.shape
    color_type = {1: 0, 3: 2, 4: 6}[c]
    # Filter type 0 (none) on every scanline: a zero byte in front of each row.
    raw = np.zeros((h, 1 + w * c), dtype=np.uint8)
    raw[:, 1:] = np.ascontiguousarray(a).reshape(h, w * c)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw.tobytes(), 9))
            + chunk(b"IEND", b""))


def png_data_uri(img: np.ndarray) -> str:
    """``data:image/png;base64,...`` URI of a uint8 image (see :func:`encode_png`)."""
    return "data:image/png;base64," + base64.b64encode(encode_png(img)).decode("ascii")


def img_tag(img: np.ndarray, alt: str, *, css: str = "") -> str:
    """An ``<img>`` element with the picture inlined; ``alt`` is escaped, pixels stay crisp."""
    style = f"image-rendering:pixelated;{css}"
    return f'<img src="{png_data_uri(img)}" alt="{html.escape(alt)}" style="{html.escape(style)}">'


def upscale(img: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour enlargement by an integer ``factor`` (≥ 1) along both image axes."""
    f = max(1, int(factor))
    return img if f == 1 else np.repeat(np.repeat(img, f, axis=0), f, axis=1)


def grid(tiles: np.ndarray, cols: int, *, gap: int = 1, background: int = 255) -> np.ndarray:
    """Lay ``n`` tiles (n×h×w or n×h×w×3) out in rows of ``cols`` with ``gap`` pixels between them."""
    n, h, w = tiles.shape[:3]
    cols = max(1, min(cols, n))
    rows = -(-n // cols)
    shape = (rows * (h + gap) - gap, cols * (w + gap) - gap, *tiles.shape[3:])
    out = np.full(shape, background, dtype=np.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        out[r * (h + gap) : r * (h + gap) + h, c * (w + gap) : c * (w + gap) + w] = tiles[i]
    return out
