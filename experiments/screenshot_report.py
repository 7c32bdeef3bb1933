"""Render the top of a run report (`python -m minirl.inspect RUN_DIR --html`) to a PNG for the docs.

    pip install weasyprint pypdfium2     # for this script only; neither is a minirl dependency
    python experiments/screenshot_report.py RUN_DIR/report.html docs/report.png

WeasyPrint lays the HTML out as a single PDF page of --width x --height CSS pixels (it draws the report's
inline SVG plots itself; what does not fit goes to later pages, which are left out); pypdfium2 renders that
page to an image (through Pillow, which it needs for that) at --zoom times the CSS pixel size.
"""

from __future__ import annotations

import argparse
from pathlib import Path

PDF_POINTS_PER_CSS_PIXEL = 0.75  # 96 CSS px per inch, 72 pt per inch


def screenshot(html: Path, png: Path, width: int, height: int, zoom: float) -> None:
    import pypdfium2
    from weasyprint import CSS, HTML

    page = CSS(string=f"@page {{ size: {width}px {height}px; margin: 0 }}")
    pdf = pypdfium2.PdfDocument(HTML(filename=str(html)).write_pdf(stylesheets=[page]))
    pdf[0].render(scale=zoom / PDF_POINTS_PER_CSS_PIXEL).to_pil().save(png)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html", type=Path, help="a report.html")
    parser.add_argument("png", type=Path, help="where to write the image")
    parser.add_argument("--width", type=int, default=1150, help="page width in CSS px (two plots side by side)")
    parser.add_argument("--height", type=int, default=1700, help="page height in CSS px: how much of the report")
    parser.add_argument("--zoom", type=float, default=1.5, help="image pixels per CSS pixel")
    args = parser.parse_args()
    if not args.html.is_file():
        parser.error(f"no report at {args.html}")
    screenshot(args.html, args.png, args.width, args.height, args.zoom)
    print(args.png)


if __name__ == "__main__":
    main()
