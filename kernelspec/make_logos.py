"""Draw the kernelspec logos (logo-32x32.png, logo-64x64.png); run once, commit the PNGs.

    .venv/bin/python kernelspec/make_logos.py

A "Z" on two overlapping squares (a snapshot and its copy-on-write fork); the isolated kernel's
squares are apart. Drawn at 8x and downsampled, so the edges are antialiased.
"""
from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

HERE = Path(__file__).resolve().parent
SCALE = 8
NAVY, BLUE, YELLOW, WHITE = (31, 59, 87, 255), (55, 118, 171, 255), (255, 212, 59, 255), (255, 255, 255, 255)


def draw(size: int, isolated: bool) -> Image.Image:
    s = size * SCALE
    img = Image.new("RGBA", (s, s), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    d.rounded_rectangle((0, 0, s - 1, s - 1), radius=s // 6, fill=NAVY)
    gap = s // 10 if isolated else 0
    # back square (the template) and front square (the fork)
    d.rounded_rectangle((s * 0.14, s * 0.14, s * 0.62 - gap / 2, s * 0.62 - gap / 2), radius=s // 16,
                        outline=YELLOW, width=max(SCALE * 2, s // 22))
    d.rounded_rectangle((s * 0.36 + gap / 2, s * 0.36 + gap / 2, s * 0.86, s * 0.86), radius=s // 16,
                        fill=BLUE, outline=YELLOW, width=max(SCALE * 2, s // 22))
    # the Z, inside the front square
    x0, y0, x1, y1 = s * 0.47 + gap / 2, s * 0.47 + gap / 2, s * 0.75, s * 0.75
    t = (y1 - y0) * 0.2
    d.polygon([(x0, y0), (x1, y0), (x1, y0 + t), (x0 + t * 1.2, y1 - t), (x1, y1 - t), (x1, y1), (x0, y1),
               (x0, y1 - t), (x1 - t * 1.2, y0 + t), (x0, y0 + t)], fill=WHITE)
    return img.resize((size, size), Image.LANCZOS)


def main() -> None:
    for name, isolated in (("zeroboot", False), ("zeroboot-isolated", True)):
        for size in (32, 64):
            draw(size, isolated).save(HERE / name / f"logo-{size}x{size}.png", optimize=True)


if __name__ == "__main__":
    main()
