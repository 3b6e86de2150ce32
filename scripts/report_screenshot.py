"""Write docs/img/report.png: the README's plan command with `--report`, rendered by headless
Chromium. The README's screenshot of the report comes from this command, not by hand.

    PYTHONPATH=. python scripts/report_screenshot.py [--out docs/img/report.png] [--browser chromium]

Needs the `report` extra (plotly) and a Chrome or Chromium on PATH.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

README_PLAN = ("--model", "llama3-70b", "--gpus", "1024", "--gpu", "h100", "--global-batch", "1024", "--seq", "8192")
TOKENS = "15e12"
"""Llama 3's pre-training token count ("over 15T tokens", Meta's Llama 3 model card)."""
WINDOW = "1280,2600"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img/report.png"))
    parser.add_argument("--browser", default=next((b for b in BROWSERS if shutil.which(b)), None))
    args = parser.parse_args()
    if args.browser is None:
        print(f"error: no browser found ({', '.join(BROWSERS)}); install chromium", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        page = Path(folder) / "plan.html"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "planner",
                "plan",
                *README_PLAN,
                "-o",
                str(Path(folder) / "plan.json"),
                "--report",
                str(page),
                "--tokens",
                TOKENS,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                args.browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--virtual-time-budget=20000",
                f"--user-data-dir={Path(folder) / 'profile'}",
                f"--window-size={WINDOW}",
                f"--screenshot={args.out.resolve()}",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
