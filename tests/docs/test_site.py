"""The built site reads from disk, as the README says (open build/site/index.html): every link between its
pages names a file, and no page loads anything from another site (the machine reading it may be offline)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)

_REFERENCE = re.compile(r'(?:href|src)="([^"]+)"')


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)]
    subprocess.run(command, cwd=ROOT, env=env, check=True, timeout=100)
    return out


def test_every_link_between_pages_names_a_file(site: Path) -> None:
    # 404.html is a web server's page (its links from the site's root), never opened from disk.
    pages = sorted(page for page in site.rglob("*.html") if page.name != "404.html")
    assert len(pages) > 20
    broken: list[str] = []
    for page in pages:
        for reference in _REFERENCE.findall(page.read_text(encoding="utf-8")):
            parts = urlsplit(reference)
            if parts.scheme or parts.netloc or not parts.path:
                continue  # another site, a mailto, or an anchor of the same page
            target = (page.parent / unquote(parts.path)).resolve()
            if not target.is_file():
                broken.append(f"{page.relative_to(site)} -> {reference}")
    assert broken == [], broken[:10]


def test_no_page_loads_anything_from_another_site(site: Path) -> None:
    loaded = re.compile(r'<(?:link|script|img)\b[^>]*(?:href|src)="(?:https?:)?//[^"]+"')
    found = {
        str(page.relative_to(site)): hits
        for page in site.rglob("*.html")
        if (hits := loaded.findall(page.read_text(encoding="utf-8")))
    }
    assert found == {}, list(found.items())[:5]
