"""Headless Chromium, as a person would look at one of fleet's pages (Debian's chromium package)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium")


def screenshot(page: Path, png: Path, size: str = "1000,1600") -> str:
    """The page as a picture, and the DOM it rendered."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={png.parent / 'chromium-profile'}"]
    subprocess.run([CHROMIUM, *flags, f"--screenshot={png}", f"--window-size={size}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    return subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                          timeout=120, check=True).stdout
