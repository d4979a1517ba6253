"""Static snapshots (the `text/html` of saved notebooks) and the standalone HTML export, without a browser."""

from __future__ import annotations

import base64
import io
import json
import re
import struct
import zlib

import numpy as np
import pytest
import torch
from snapshot_models import (  # tests/widget is on sys.path (rootdir-relative imports)
    BUILDERS,
    HOSTILE,
)
from torch import nn

from nbdebug.inspectors.attention import display_token
from nbdebug.widgets._export import request_key
from nbdebug.widgets._snapshot import (
    MAX_SNAPSHOT_BYTES,
    colorize,
    css_color,
    encode_png,
    lut,
    upscale,
)
from nbdebug.widgets._transport import decode_array

pytest.importorskip("transformers")

URI = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def read_png(data: bytes) -> np.ndarray:
    """Our own decoder for what encode_png writes (8-bit, filter 0): checks signature, IHDR and CRCs."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n : pos + 12 + n])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        chunks.append((kind, body))
        pos += 12 + n
    assert chunks[0][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    w, h, depth, ctype, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, comp, filt, interlace) == (8, 0, 0, 0)
    c = {0: 1, 2: 3, 6: 4}[ctype]
    raw = np.frombuffer(zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT")), np.uint8).reshape(h, 1 + w * c)
    assert (raw[:, 0] == 0).all()
    img = raw[:, 1:].reshape(h, w, c)
    return img[:, :, 0] if c == 1 else img


def parse_tags(html: str) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """Every start tag of ``html`` with its attributes, as a browser's tokenizer sees them."""
    from html.parser import HTMLParser

    tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    class P(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            tags.append((tag, attrs))

    P().feed(html)
    return tags


def images(html: str) -> list[np.ndarray]:
    out = []
    for b64 in URI.findall(html):
        data = base64.b64decode(b64)
        img = read_png(data)
        try:
            from PIL import Image
        except ImportError:  # pragma: no cover - PIL is optional
            pass
        else:
            with Image.open(io.BytesIO(data)) as pil:
                np.testing.assert_array_equal(np.asarray(pil.convert("RGB")), img)
        out.append(img)
    return out


def test_png_encoder_roundtrip_gray_rgb_rgba() -> None:
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (7, 5), (3, 9, 3), (4, 2, 4)]:
        a = rng.integers(0, 256, shape, dtype=np.uint8)
        np.testing.assert_array_equal(read_png(encode_png(a)), a)
    pytest.importorskip("PIL")
    from PIL import Image

    a = rng.integers(0, 256, (6, 11, 4), dtype=np.uint8)
    with Image.open(io.BytesIO(encode_png(a))) as pil:
        assert pil.size == (11, 6) and pil.mode == "RGBA"
        np.testing.assert_array_equal(np.asarray(pil), a)
    with pytest.raises(TypeError):
        encode_png(a.astype(np.float32))
    with pytest.raises(ValueError):
        encode_png(np.zeros((2, 2, 2), np.uint8))


def test_lut_matches_the_js_tables() -> None:
    v = lut("viridis")
    assert v.shape == (256, 3) and v.dtype == np.uint8
    assert v[0].tolist() == [0x44, 0x01, 0x54] and v[255].tolist() == [0xFD, 0xE7, 0x25]
    np.testing.assert_array_equal(lut("gray"), np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, 1))
    # RdBu has 11 control points: entry 128 sits at 128/255·10 = 5.0196 between #f7f7f7 and #d1e5f0
    f = 128 / 255 * 10 - 5
    assert lut("RdBu")[128].tolist() == [int(np.floor(a * (1 - f) + b * f + 0.5)) for a, b in [(0xF7, 0xD1), (0xF7, 0xE5), (0xF7, 0xF0)]]
    assert lut("nonsense") is lut("viridis")
    assert css_color("viridis", 2.0) == "rgb(253,231,37)" and css_color("viridis", float("nan")) == "rgb(68,1,84)"


@pytest.fixture(scope="module")
def widgets() -> dict:
    return {name: build() for name, build in BUILDERS.items()}


@pytest.mark.parametrize("view", list(BUILDERS))
def test_fallback_is_small_static_and_escaped(widgets, view) -> None:  # type: ignore[no-untyped-def]
    w = widgets[view]
    html = w.fallback_html()
    assert len(html.encode()) <= MAX_SNAPSHOT_BYTES
    assert "<script" not in html.lower()
    tags = parse_tags(html)
    assert all(not a.startswith("on") for _t, attrs in tags for a, _v in attrs)  # no event handlers
    assert all(dict(attrs)["src"].startswith("data:image/png;base64,") for t, attrs in tags if t == "img")
    assert HOSTILE not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    data, _meta = w._repr_mimebundle_()
    assert data["text/html"] == html and "application/vnd.jupyter.widget-view+json" in data
    if view != "thermometer" and view != "logitlens":
        assert '<img src="data:image/png;base64,' in html


def test_featuremaps_snapshot_is_the_first_page(widgets) -> None:  # type: ignore[no-untyped-def]
    w = widgets["featuremaps"]
    opened = w.layer  # the view opens on an informative layer (issue 9); this test reads layer "0"
    w.layer = "0"
    try:
        _check_first_page(w)
    finally:
        w.layer = opened


def _check_first_page(w) -> None:  # type: ignore[no-untyped-def]
    (img,) = images(w.fallback_html())
    content, buffers = w.handle_request("page", {"layer": w.layer, "sample": w.sample, "sort": w.sort, "start": 0})
    pix = decode_array({"view": buffers[content["arrays"]["pixels"]["buffer"]], **{k: content["arrays"]["pixels"][k] for k in ("dtype", "shape")}})
    n, h, _ = pix.shape
    assert (n, h) == (8, 16)  # 8 channels of 16×16, drawn 3× larger in a 3×3 grid with 2-pixel gaps
    assert img.shape == (3 * 48 + 4, 3 * 48 + 4, 3)
    np.testing.assert_array_equal(img[:48, :48], colorize(upscale(pix[0], 3), "viridis"))
    np.testing.assert_array_equal(img[50:98, 50:98], colorize(upscale(pix[4], 3), "viridis"))
    assert (img[48:50] == 255).all()


def test_gradcam_snapshot_blends_the_top_class(widgets) -> None:  # type: ignore[no-untyped-def]
    w = widgets["gradcam"]
    (img,) = images(w.fallback_html())
    content, buffers = w.handle_request("view", {"sample": w.sample, "layer": w.layer})
    arr = {k: np.frombuffer(bytes(buffers[m["buffer"]]), m["dtype"]).reshape(m["shape"]) for k, m in content["arrays"].items()}
    assert img.shape == (224, 224, 3)  # 16×16 enlarged 14×
    heat = lut("inferno")[arr["cams"][0]].astype(np.float64)
    expected = 0.5 * arr["image"].astype(np.float64) + 0.5 * heat
    np.testing.assert_allclose(img[::14, ::14], expected, atol=0.51)
    w.class_rank, w.opacity = 1, 1.0
    (img2,) = images(w.fallback_html())
    np.testing.assert_array_equal(img2[::14, ::14], lut("inferno")[arr["cams"][1]])
    w.class_rank, w.opacity = 0, 0.5


def test_attention_snapshot_is_the_thumbnail_grid(widgets) -> None:  # type: ignore[no-untyped-def]
    w = widgets["attention"]
    imgs = images(w.fallback_html())
    thumbs = decode_array(w.thumbs)
    assert len(imgs) == 2 and thumbs.shape == (2, 2, 8, 8)
    for layer, img in enumerate(imgs):
        assert img.shape == (40, 83, 3)  # two 40-pixel heads and a 3-pixel gap
        np.testing.assert_array_equal(img[:, :40], colorize(upscale(thumbs[layer, 0], 5), "viridis"))
        np.testing.assert_array_equal(img[:, 43:], colorize(upscale(thumbs[layer, 1], 5), "viridis"))


def test_logitlens_snapshot_table_coloured_by_probability(widgets) -> None:  # type: ignore[no-untyped-def]
    w = widgets["logitlens"]
    html = w.fallback_html()
    cells = re.findall(r"<td style='background:(rgb\(\d+,\d+,\d+\));[^>]*>([^<]*)</td>", html)
    lens = w.lens
    assert len(cells) == lens.R * lens.T
    cols = lens.columns(range(lens.T))
    for r in range(lens.R):
        for p in range(lens.T):
            colour, text = cells[(lens.R - 1 - r) * lens.T + p]  # last layer first
            assert colour == css_color("viridis", float(cols["top_probs"][r, p, 0]))
            assert text == display_token(lens.vocab[int(cols["top_ids"][r, p, 0])])[:16].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def test_featuremaps_snapshot_stays_under_budget_for_a_large_noisy_layer() -> None:
    from nbdebug.recorders.featuremaps import FeatureMapsRecorder

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1))
    with FeatureMapsRecorder(m) as rec:
        m(torch.randn(1, 3, 112, 112))  # incompressible noise: 64 × 112 × 112 values
    html = rec.widget().fallback_html()
    assert len(html.encode()) <= MAX_SNAPSHOT_BYTES
    (img,) = images(html)
    assert img.shape[0] >= 8 * 28 and "every" in html  # decimated, and says so


@pytest.mark.parametrize("view", list(BUILDERS))
def test_export_inlines_module_state_and_answers(widgets, view, tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = widgets[view]
    path = w.save_html(tmp_path / f"{view}.html")
    page = path.read_text(encoding="utf-8")
    assert f"<title>nbdebug {view}</title>" in page and HOSTILE not in page
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page  # no CDN
    data = json.loads(re.search(r'<script type="application/json" id="nbdebug-data">(.*?)</script>', page, re.S).group(1))
    esm = json.loads(re.search(r'<script type="application/json" id="nbdebug-esm">(.*?)</script>', page, re.S).group(1))
    assert "render" in esm and "export" in esm
    keys = [a["key"] for a in data["answers"]]
    assert keys == [request_key(m, p) for m, p in w.export_requests()] and keys
    assert all(a["ok"] for a in data["answers"])
    # binary state round-trips through base64 + buffer paths
    for path_, b64 in zip(data["buffer_paths"], data["buffers"], strict=True):
        assert base64.b64decode(b64) == bytes(_at(w.get_state(), path_))


def _at(state, path):  # type: ignore[no-untyped-def]
    for p in path:
        state = state[p]
    return state


def test_export_budget_leaves_answers_out_and_says_so(widgets) -> None:  # type: ignore[no-untyped-def]
    w = widgets["logitlens"]
    full = w.export_html()
    small = w.export_html(max_bytes=len(full) - 2000)
    assert "left out" not in full and "left out to keep this file under" in small
    count = lambda page: len(json.loads(re.search(r'id="nbdebug-data">(.*?)</script>', page, re.S).group(1))["answers"])  # noqa: E731
    assert 0 < count(small) < count(full) == len(w.export_requests())
    assert len(small.encode()) <= len(full) - 2000


def test_request_key_is_canonical() -> None:
    assert request_key("page", {"start": 0, "layer": "é<", "sample": 1}) == 'page {"layer":"é<","sample":1,"start":0}'


def test_attention_snapshot_stays_under_budget_for_many_noisy_heads() -> None:
    from nbdebug.widgets.attention import model_view

    torch.manual_seed(0)
    att = [torch.softmax(torch.randn(1, 12, 128, 128) * 3, dim=-1) for _ in range(12)]  # 144 noisy heads
    w = model_view(att, [f"t{i}" for i in range(128)])
    html = w.fallback_html()
    assert len(html.encode()) <= MAX_SNAPSHOT_BYTES
    imgs = images(html)
    assert len(imgs) == 12 and all(img.shape == imgs[0].shape for img in imgs)
    s = decode_array(w.thumbs).shape[-1]
    side = imgs[0].shape[0]
    assert side < s and "every" in html  # decimated to fit, and says so
    step = -(-s // side)
    np.testing.assert_array_equal(imgs[3][:, :side], colorize(decode_array(w.thumbs)[3, 0, ::step, ::step], "viridis"))
