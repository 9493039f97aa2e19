"""Open a report in headless Chromium at a given window width and measure what a reader sees.

The page itself carries no script; a copy gets a probe appended that records the page's scroll
width against the window, each figure's painted box and each section heading's position, and
Chromium's --dump-dom returns it. A screenshot of the first screen is written beside the copy.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

PROBE = """<script>
(function () {
  const de = document.documentElement;
  const figures = [...document.querySelectorAll('figure')].map(f => {
    const s = f.querySelector('svg'); const r = s.getBoundingClientRect();
    return {id: f.id, width: r.width, height: r.height, right: r.right,
            marks: s.querySelectorAll('rect,circle,line,path,polyline').length};
  });
  const headings = [...document.querySelectorAll('h2')].map(h => ({text: h.textContent,
    top: h.getBoundingClientRect().top + window.scrollY}));
  const tables = [...document.querySelectorAll('table')].map(t => ({top: t.getBoundingClientRect().top + window.scrollY,
    caption: (t.caption || {}).textContent || ''}));
  const boxes = [...document.querySelectorAll('.box')].map(b => {const r = b.getBoundingClientRect();
    return {top: r.top + window.scrollY, bottom: r.bottom + window.scrollY, text: b.textContent};});
  const out = {scrollWidth: Math.max(de.scrollWidth, document.body.scrollWidth), clientWidth: de.clientWidth,
               innerWidth: window.innerWidth, figures: figures, headings: headings, tables: tables, boxes: boxes};
  const pre = document.createElement('pre'); pre.id = 'probe'; pre.style.display = 'none';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
})();
</script>"""
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@dataclass(frozen=True)
class Rendering:
    scroll_width: int
    client_width: int
    figures: list[dict]
    headings: list[dict]
    tables: list[dict]
    boxes: list[dict]
    screenshot: Path


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def render(html: Path, work: Path, width: int = 1280, height: int = 900) -> Rendering:
    """Measure ``html`` at ``width`` px; screenshot the first ``height`` px to ``work/first-screen.png``."""
    browser = chromium()
    if browser is None:
        raise AssertionError("Chromium is required (./bootstrap installs it where apt-get is available)")
    work.mkdir(parents=True, exist_ok=True)
    probed = work / "probed.html"
    probed.write_text(html.read_text().replace("</body>", PROBE + "</body>"))
    common = [browser, *FLAGS, f"--user-data-dir={work / 'profile'}", f"--window-size={width},{height}"]
    dom = subprocess.run([*common, "--dump-dom", probed.as_uri()], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    found = re.search(r'<pre id="probe"[^>]*>(.*?)</pre>', dom, re.S)
    if found is None:
        raise AssertionError(f"the probe did not run in {probed}")
    data = json.loads(found.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))
    shot = work / "first-screen.png"
    subprocess.run([*common, f"--screenshot={shot}", html.resolve().as_uri()], check=True, capture_output=True, timeout=120)
    return Rendering(int(data["scrollWidth"]), int(data["clientWidth"]), data["figures"], data["headings"],
                     data["tables"], data["boxes"], shot)
