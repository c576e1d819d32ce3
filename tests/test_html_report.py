"""report.html in a real headless browser, on real traces.

`zoomer-ar analyze` runs on a few real traces; Chromium renders each report.html to a PNG
screenshot and dumps the DOM after rendering. The screenshot is decoded with a small
zlib + numpy PNG reader (no imaging dependency) and checked for what a reader sees: the page
is not blank, the GPU timeline is drawn in blue with the right busy share, and each severity
badge colour appears exactly when a finding of that severity exists. The DOM must hold every
finding, one summary-table row per finding, and kernel names with `<...>` as text. The HTML
must be self-contained (no network resources).

Chromium is required in CI (`.ci/run` installs it); elsewhere the browser tests skip when it is
missing. Set ZOOMER_CHROMIUM to use another Chromium-compatible binary, ZOOMER_KEEP_SCREENSHOTS
to a folder to keep the PNGs for a look.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from zoomer_ar.cli import main

from conftest import SHARED_TRACES

WIDTH, HEIGHT = 1280, 2400
# (trace relative to the corpus, has GPU activity)
CASES = [
    ("kineto/resnet50_num_workers_0", True),
    ("param/dlrm_8ranks", True),
    ("hta/mixed_files/rank_non_gpu.json.gz", False),
]
BUSY_BLUE = (0x2F, 0x6F, 0xDE)
IDLE_BG = (0xEE, 0xF2, 0xF8)
SEVERITY_RGB = {
    "critical": (0xB3, 0x26, 0x1E),
    "high": (0xD9, 0x48, 0x0F),
    "medium": (0xC7, 0x7C, 0x02),
    "low": (0x2B, 0x7A, 0x0B),
    "info": (0x4A, 0x55, 0x68),
}
MIN_BADGE_PIXELS = 150  # one badge is ~60 x 18 px of solid colour


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def chromium_binary() -> str | None:
    env = os.environ.get("ZOOMER_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def read_png(path: Path) -> np.ndarray:
    """Decode an 8-bit, non-interlaced RGB/RGBA PNG into an (H, W, 3) uint8 array.

    Handles the five PNG row filters; None/Sub/Up are vectorised with numpy, Average and Paeth
    (which depend on the pixel to the left) run per byte.
    """
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    assert header is not None, "PNG without IHDR"
    w, h, depth, ctype, _, _, interlace = header
    assert depth == 8 and ctype in (2, 6) and interlace == 0, f"unsupported PNG {header}"
    bpp = 3 if ctype == 2 else 4
    stride = w * bpp
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(h, stride + 1)
    out = np.zeros((h, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(h):
        ftype, line = int(raw[y, 0]), raw[y, 1:]
        if ftype == 0:
            cur = line
        elif ftype == 1:
            cur = (np.cumsum(line.reshape(w, bpp), axis=0, dtype=np.uint64) % 256).astype(np.uint8).ravel()
        elif ftype == 2:
            cur = line + prev
        elif ftype in (3, 4):
            buf, up = bytearray(line.tobytes()), prev.tobytes()
            for i in range(stride):
                a = buf[i - bpp] if i >= bpp else 0
                b = up[i]
                if ftype == 3:
                    buf[i] = (buf[i] + ((a + b) >> 1)) & 255
                    continue
                c = up[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                buf[i] = (buf[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            cur = np.frombuffer(bytes(buf), dtype=np.uint8)
        else:
            raise AssertionError(f"bad PNG filter type {ftype}")
        out[y] = cur
        prev = out[y]
    return out.reshape(h, w, bpp)[:, :, :3]


def color_mask(img: np.ndarray, rgb: tuple[int, int, int], tol: int = 0) -> np.ndarray:
    return (np.abs(img.astype(np.int16) - np.asarray(rgb, dtype=np.int16)) <= tol).all(axis=2)


class DomIndex(HTMLParser):
    """The bits of the rendered DOM the tests look at."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, {k: v or "" for k, v in attrs}))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        (self.styles if self._in_style else self.text).append(data)

    def find(self, tag: str | None = None, **attrs: str) -> list[dict[str, str]]:
        found = []
        for t, a in self.elements:
            if tag is not None and t != tag:
                continue
            if all((v is True and k in a) or a.get(k) == v or (k == "class_" and v in a.get("class", "").split())
                   for k, v in attrs.items()):
                found.append(a)
        return found

    @property
    def all_text(self) -> str:
        return "".join(self.text)


def parse_html(text: str) -> DomIndex:
    dom = DomIndex()
    dom.feed(text)
    dom.close()
    return dom


def run_chromium(binary: str, html: Path, workdir: Path, *, screenshot: Path | None = None) -> str:
    args = [
        binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-extensions", "--hide-scrollbars", "--force-device-scale-factor=1",
        "--host-resolver-rules=MAP * ~NOTFOUND",  # nothing may come from the network
        f"--user-data-dir={workdir / 'chromium-profile'}", f"--window-size={WIDTH},{HEIGHT}",
    ]
    args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    proc = subprocess.run(args + [html.resolve().as_uri()], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}"
    if screenshot:
        assert screenshot.is_file(), f"chromium wrote no screenshot: {proc.stderr[-2000:]}"
    return proc.stdout


# --------------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = chromium_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("headless Chromium is required in CI (apt-get install -y chromium)")
        pytest.skip("chromium not installed (apt-get install -y chromium); CI is not set, so the browser tests skip")
    return binary


@pytest.fixture(scope="module")
def reports(tmp_path_factory, shared_traces) -> dict[str, tuple[Path, dict]]:
    """rel -> (out dir, findings.json) for every case, analysed once per module."""
    root = tmp_path_factory.mktemp("html")
    done = {}
    for rel, _ in CASES:
        out = root / rel.replace("/", "__")
        rc = main(["analyze", str(SHARED_TRACES / rel), "--out", str(out), "--format", "json", "--no-progress"])
        assert rc == 0, f"analyze {rel} exited {rc}"
        done[rel] = (out, json.loads((out / "findings.json").read_text()))
    return done


@pytest.fixture(scope="module")
def rendered(reports, chromium, tmp_path_factory) -> dict[str, tuple[np.ndarray, DomIndex, dict]]:
    """rel -> (screenshot pixels, rendered DOM, findings.json)."""
    work = tmp_path_factory.mktemp("chromium")
    keep = os.environ.get("ZOOMER_KEEP_SCREENSHOTS")
    done = {}
    for rel, (out, doc) in reports.items():
        png = work / (rel.replace("/", "__") + ".png")
        run_chromium(chromium, out / "report.html", work, screenshot=png)
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(png, Path(keep) / png.name)
        dom = parse_html(run_chromium(chromium, out / "report.html", work))
        done[rel] = (read_png(png), dom, doc)
    return done


# --------------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------------

_REMOTE = re.compile(r"^\s*(https?:)?//", re.I)
_CSS_REMOTE = re.compile(r"(@import|url\(\s*['\"]?\s*(https?:)?//)", re.I)


@pytest.mark.parametrize("rel", [c[0] for c in CASES])
def test_html_is_self_contained(rel, reports):
    out, _ = reports[rel]
    dom = parse_html((out / "report.html").read_text(encoding="utf-8"))
    assert not dom.find("script"), "the report must not carry scripts"
    for tag, attr in (("img", "src"), ("iframe", "src"), ("source", "src"), ("video", "src"), ("audio", "src"),
                      ("embed", "src"), ("object", "data"), ("link", "href"), ("image", "href")):
        for a in dom.find(tag):
            ref = a.get(attr, "")
            assert not _REMOTE.match(ref), f"<{tag} {attr}={ref!r}> loads from the network"
            if tag == "link":
                rel_attr = a.get("rel", "").lower()
                assert not any(r in rel_attr for r in ("stylesheet", "preload", "icon", "import")), \
                    f"external <link rel={rel_attr!r}>"
    css = "".join(dom.styles) + " ".join(a.get("style", "") for _, a in dom.elements)
    assert not _CSS_REMOTE.search(css), "CSS imports or loads a URL"
    assert "@font-face" not in css, "no web fonts: system fonts only"
    # references are plain links, which is fine, and nothing else points outside
    for a in dom.find("a"):
        assert a.get("href", "").startswith(("#", "http://", "https://")), a


@pytest.mark.browser
@pytest.mark.parametrize("rel,has_gpu", CASES)
def test_dom_lists_every_finding(rel, has_gpu, rendered):
    _, dom, doc = rendered[rel]
    findings = doc["findings"]
    assert findings, f"{rel}: expected findings on this trace"
    rows = dom.find("tr", class_="finding-row")
    assert len(rows) == len(findings), "one summary-table row per finding"
    assert [r["data-finding"] for r in rows] == [f["pattern"] for f in findings], "rows in ranked order"
    ids = {a.get("id") for _, a in dom.elements}
    text = dom.all_text
    for f in findings:
        assert f"f-{f['pattern']}" in ids, f"finding section for {f['pattern']} missing"
        assert dom.find("a", href=f"#f-{f['pattern']}"), f"summary link to {f['pattern']} missing"
        assert f["title"] in text
        assert f["severity"] in text.lower()
        # event names (kernel templates such as `gemm<float, 128>`) must be text, not swallowed as tags
        for e in f["evidence"]["events"]:
            assert e["name"][:140] in text, f"event name lost in the DOM: {e['name'][:140]!r}"
    assert len(dom.find("article", class_="finding")) == len(findings)
    assert f"{len(findings)}" in text and "findings" in text
    svgs = [a for t, a in dom.elements if t == "svg"]
    if has_gpu:
        assert len(svgs) == 1, "the GPU timeline is one inline SVG"
        assert len(dom.find("rect")) == len(doc["timeline"]) + 1, "one bar per timeline bin plus the background"
    else:
        assert not svgs and "No GPU activity in this trace." in text
        assert "CPU-only" in text


@pytest.mark.browser
@pytest.mark.parametrize("rel,has_gpu", CASES)
def test_screenshot_shows_the_report(rel, has_gpu, rendered):
    img, _, doc = rendered[rel]
    assert img.shape == (HEIGHT, WIDTH, 3)
    # not blank: many colours, a good share of non-background pixels, dark text present
    flat = img.reshape(-1, 3)
    sample = flat[:: 97]
    assert len({tuple(p) for p in sample.tolist()}) > 50, "screenshot looks blank"
    background = color_mask(img, (0xF6, 0xF8, 0xFB), tol=1) | color_mask(img, (255, 255, 255), tol=1)
    assert background.mean() < 0.97, "screenshot is almost all background"
    assert (img.sum(axis=2) < 150).sum() > 2000, "no dark text on the page"

    # the GPU timeline: its idle background and the busy bars, busy share as the bins say
    idle = color_mask(img, IDLE_BG)
    busy = color_mask(img, BUSY_BLUE)
    if not has_gpu:
        assert idle.sum() == 0, "no timeline expected without GPU activity"
        return
    ys, xs = np.nonzero(idle)
    assert ys.size > 1000, "timeline background not drawn"
    y0, y1, x0, x1 = ys.min(), ys.max(), xs.min(), xs.max()
    assert y1 < 900, "the timeline belongs near the top of the page"
    assert x1 - x0 > WIDTH // 2 and 60 <= y1 - y0 <= 160, (x0, x1, y0, y1)
    in_box_busy = int(busy[y0:y1 + 1, x0:x1 + 1].sum())
    in_box_idle = int(idle[y0:y1 + 1, x0:x1 + 1].sum())
    assert in_box_busy > 500, "no blue GPU-busy bars inside the timeline"
    drawn = 100.0 * in_box_busy / (in_box_busy + in_box_idle)
    expected = float(np.mean([b["busy_pct"] for b in doc["timeline"]]))
    assert abs(drawn - expected) < 5.0, f"timeline shows {drawn:.1f}% busy, bins say {expected:.1f}%"


@pytest.mark.browser
@pytest.mark.parametrize("rel,has_gpu", CASES)
def test_severity_badges_coloured(rel, has_gpu, rendered):
    img, _, doc = rendered[rel]
    present = {f["severity"] for f in doc["findings"]}
    for severity, rgb in SEVERITY_RGB.items():
        n = int(color_mask(img, rgb, tol=1).sum())
        if severity in present:
            assert n >= MIN_BADGE_PIXELS, f"{severity} badge colour missing ({n} px)"
        else:
            # severity colours are reserved for badges: nothing else on the page uses them
            assert n < MIN_BADGE_PIXELS, f"{severity} colour shows ({n} px) with no {severity} finding"
