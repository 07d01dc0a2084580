"""Generate the synthetic example pool in ``examples/pool/``.

The pool follows rsieve's pool contract: a folder with ``items.jsonl`` and the PNG
images it names, one JSON object per line with ``id``, ``family``, ``image`` (relative to the
pool folder), ``question``, ``answer``, ``source`` (generator and sha256 of the PNG bytes) and
optionally ``protocol``.

Families:

* ``SynthWords``: scene-text style word crops (alnum protocol from the family table). Most
  are clean renders an OCR model reads right; a few are hard on purpose (heavy blur, very
  low contrast, strong rotation, clutter) so they land in the rejected split. One image is
  asked about twice, so the dataset gets one row with two ``qa`` entries.
* ``SynthAmounts``: ORAND-CAR style courtesy amounts, digits drawn glyph by glyph with
  oblique/condensed fonts and jitter; a few hard ones.
* ``SynthChoice``: a word image with a four-option multiple-choice question
  (``"protocol": "mc"``); the reference is the bare option letter.

The output is byte-identical on every run (on the same Pillow/FreeType/zlib and DejaVu
fonts): every random choice comes from a fixed per-image seed, text is laid out with
Pillow's basic layout engine, and PNGs are written without metadata. Only the standard
library and Pillow are needed; ``--check`` additionally runs RapidOCR recognition on every
image (needs ``rapidocr-onnxruntime`` and numpy) and prints what it read.

Usage::

    python scripts/make_example_pool.py [--out DIR] [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter, ImageFont

GENERATOR = "scripts/make_example_pool.py"
FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "examples" / "pool"

WORDS_QUESTION = "What word or text is shown in this cropped image? Answer with the text only."
WORDS_SECOND_QUESTION = "Read the text in the image. Answer with the text only."
AMOUNTS_QUESTION = (
    "Transcribe the handwritten digits from left to right. Answer with the digit string only "
    "(no spaces, separators, punctuation or currency signs)."
)
CHOICE_QUESTION = "Which word is shown in the image?"
CHOICE_SUFFIX = "Answer with the option's letter from the given choices directly."
LETTERS = "ABCD"

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class WordSpec:
    """A scene-text style word crop."""

    text: str
    font: str
    size: int
    fg: RGB
    bg: RGB
    stroke: int = 0
    stroke_fill: RGB = (0, 0, 0)
    rotate: float = 0.0
    blur: float = 0.0
    noise: float = 0.0
    clutter: int = 0
    hard: bool = False


@dataclass(frozen=True)
class AmountSpec:
    """A handwritten-looking courtesy amount; ``text`` is what is drawn."""

    text: str
    font: str
    size: int
    slant: float = 0.0
    jitter: float = 2.0
    advance: float = 0.8
    ink: int = 30
    paper: int = 236
    blur: float = 0.0
    rotate: float = 0.0
    noise: float = 0.0
    strike: int = 0
    hard: bool = False


@dataclass(frozen=True)
class ChoiceSpec:
    """A word image with four options; ``answer`` indexes ``options``."""

    word: WordSpec
    options: tuple[str, str, str, str]
    answer: int


# Easy items should be read right by an OCR model, ``hard=True`` ones should not.
WORDS: tuple[WordSpec, ...] = (
    WordSpec("COFFEE", "DejaVuSans-Bold.ttf", 40, (250, 246, 236), (112, 58, 32)),
    WordSpec("station", "DejaVuSerif.ttf", 38, (20, 24, 40), (228, 224, 210), noise=0.06),
    WordSpec("Market", "DejaVuSans.ttf", 42, (255, 255, 255), (30, 110, 60), rotate=-3.0),
    WordSpec("PARKING", "DejaVuSansMono-Bold.ttf", 36, (255, 255, 255), (28, 70, 160)),
    WordSpec("hotel", "DejaVuSerif-Bold.ttf", 44, (200, 30, 40), (245, 240, 230), blur=0.8),
    WordSpec(
        "Bakery",
        "DejaVuSerif-Italic.ttf",
        40,
        (250, 220, 120),
        (60, 40, 30),
        stroke=1,
        stroke_fill=(20, 10, 5),
    ),
    WordSpec("EXIT", "DejaVuSansCondensed-Bold.ttf", 46, (255, 255, 255), (0, 130, 70)),
    WordSpec("library", "DejaVuSansMono.ttf", 36, (30, 30, 30), (210, 215, 220), noise=0.08),
    WordSpec(
        "GARDEN",
        "DejaVuSerifCondensed-Bold.ttf",
        40,
        (240, 240, 200),
        (70, 90, 40),
        rotate=2.5,
        blur=0.6,
    ),
    WordSpec("pharmacy", "DejaVuSans-Oblique.ttf", 38, (0, 120, 60), (250, 250, 250)),
    WordSpec(
        "HOSPITAL", "DejaVuSerifCondensed.ttf", 36, (255, 255, 255), (180, 30, 30), noise=0.05
    ),
    # Hard: heavy blur, very low contrast, strong rotation, overlapping clutter.
    WordSpec("SUNSET", "DejaVuSans.ttf", 36, (40, 40, 40), (220, 200, 160), blur=8.0, hard=True),
    WordSpec(
        "window", "DejaVuSerif.ttf", 38, (132, 132, 128), (138, 137, 133), noise=0.10, hard=True
    ),
    WordSpec(
        "Theatre", "DejaVuSans-Bold.ttf", 38, (240, 240, 240), (90, 30, 90), rotate=65.0, hard=True
    ),
    WordSpec("museum", "DejaVuSerif.ttf", 38, (30, 30, 30), (235, 230, 220), clutter=14, hard=True),
)
# Index into WORDS of the image that gets the second question.
SHARED_WORD = 2

AMOUNTS: tuple[AmountSpec, ...] = (
    AmountSpec("3172", "DejaVuSansCondensed-Oblique.ttf", 40, slant=0.15),
    AmountSpec("13.581", "DejaVuSerifCondensed-Italic.ttf", 40, slant=0.1),
    AmountSpec("2072", "DejaVuSansMono-Oblique.ttf", 38, jitter=3.0),
    AmountSpec("45.000", "DejaVuSansCondensed-BoldOblique.ttf", 38, slant=0.2, ink=50),
    AmountSpec("10359", "DejaVuSerifCondensed-Italic.ttf", 42, jitter=2.5, paper=226),
    AmountSpec("806", "DejaVuSans-Oblique.ttf", 44, slant=0.1, blur=0.7),
    AmountSpec("1.250.000", "DejaVuSansCondensed-Oblique.ttf", 36, advance=0.78),
    AmountSpec("97641", "DejaVuSerif-BoldItalic.ttf", 38, jitter=2.0, rotate=-2.0),
    AmountSpec("52480", "DejaVuSansMono-BoldOblique.ttf", 36, slant=0.12, jitter=2.5),
    # Hard: heavy blur, faint ink, digits crowded on top of each other, struck through.
    AmountSpec("58203", "DejaVuSansCondensed-Oblique.ttf", 40, blur=9.0, hard=True),
    AmountSpec(
        "6114", "DejaVuSerifCondensed-Italic.ttf", 40, ink=221, paper=226, noise=0.12, hard=True
    ),
    AmountSpec(
        "700925", "DejaVuSansCondensed-BoldOblique.ttf", 40, advance=0.3, jitter=5.0, hard=True
    ),
    AmountSpec("38", "DejaVuSans-Oblique.ttf", 44, rotate=80.0, strike=3, hard=True),
    AmountSpec("914", "DejaVuSerifCondensed-Italic.ttf", 42, strike=5, noise=0.1, hard=True),
)

CHOICES: tuple[ChoiceSpec, ...] = (
    ChoiceSpec(
        WordSpec("BRIDGE", "DejaVuSans-Bold.ttf", 40, (255, 255, 255), (40, 40, 40)),
        ("BRIDE", "BRIDGE", "RIDGE", "BADGE"),
        1,
    ),
    ChoiceSpec(
        WordSpec("forest", "DejaVuSerif.ttf", 40, (20, 60, 20), (225, 235, 215)),
        ("forest", "forget", "frost", "florist"),
        0,
    ),
    ChoiceSpec(
        WordSpec("Harbor", "DejaVuSans.ttf", 40, (250, 250, 250), (20, 80, 140)),
        ("Harper", "Arbor", "Barber", "Harbor"),
        3,
    ),
    ChoiceSpec(
        WordSpec("CANDLE", "DejaVuSerifCondensed-Bold.ttf", 40, (250, 200, 60), (50, 30, 60)),
        ("HANDLE", "CANDY", "CANDLE", "CANOE"),
        2,
    ),
    ChoiceSpec(
        WordSpec("bicycle", "DejaVuSansMono.ttf", 38, (30, 30, 30), (240, 238, 230)),
        ("bicycle", "recycle", "tricycle", "bicep"),
        0,
    ),
    ChoiceSpec(
        WordSpec("Tunnel", "DejaVuSans-Oblique.ttf", 40, (255, 240, 220), (110, 50, 20)),
        ("Funnel", "Tunnel", "Tinsel", "Kennel"),
        1,
    ),
)


@dataclass(frozen=True)
class Item:
    """One pool line plus the rendered image it names."""

    id: str
    family: str
    image: str
    question: str
    answer: str
    protocol: str | None
    png: bytes
    hard: bool

    def record(self) -> dict[str, object]:
        """The JSON object written to ``items.jsonl``."""
        rec: dict[str, object] = {
            "id": self.id,
            "family": self.family,
            "image": self.image,
            "question": self.question,
            "answer": self.answer,
            "source": {"generator": GENERATOR, "sha256": hashlib.sha256(self.png).hexdigest()},
        }
        if self.protocol is not None:
            rec["protocol"] = self.protocol
        return rec


def font(name: str, size: int) -> ImageFont.FreeTypeFont:
    """A DejaVu font with the basic layout engine (same glyph placement with or without raqm)."""
    return ImageFont.truetype(str(FONT_DIR / name), size, layout_engine=ImageFont.Layout.BASIC)


def bbox(fnt: ImageFont.FreeTypeFont, text: str, stroke: int = 0) -> tuple[int, int, int, int]:
    """The ink bounding box of ``text`` in whole pixels."""
    left, top, right, bottom = fnt.getbbox(text, stroke_width=stroke)
    return int(left), int(top), int(right), int(bottom)


def png_bytes(img: Image.Image) -> bytes:
    """Encode ``img`` as a PNG without any metadata chunks."""
    clean = Image.frombytes(img.mode, img.size, img.tobytes())
    buf = io.BytesIO()
    clean.save(buf, format="PNG", compress_level=9)
    return buf.getvalue()


def noise_layer(rng: random.Random, size: tuple[int, int]) -> Image.Image:
    """Uniform grey noise from ``rng`` (Pillow's own noise is not seedable)."""
    return Image.frombytes("L", size, rng.randbytes(size[0] * size[1]))


def render_word(spec: WordSpec, seed: int) -> Image.Image:
    """Render a scene-text style crop of ``spec.text``."""
    rng = random.Random(seed)
    fnt = font(spec.font, spec.size)
    left, top, right, bottom = bbox(fnt, spec.text, stroke=spec.stroke)
    pad_x = 10 + rng.randint(0, 8)
    pad_y = 8 + rng.randint(0, 6)
    w, h = right - left + 2 * pad_x, bottom - top + 2 * pad_y
    img = Image.new("RGB", (w, h), spec.bg)
    draw = ImageDraw.Draw(img)
    # A faint band across the sign, so the background is not perfectly flat.
    r, g, b = (max(0, min(255, c + rng.choice((-14, 14)))) for c in spec.bg)
    band_y = rng.randint(0, h // 2)
    draw.rectangle((0, band_y, w, band_y + h // 3), fill=(r, g, b))
    if spec.clutter:
        clutter_font = font("DejaVuSans.ttf", spec.size)
        for _ in range(spec.clutter):
            x0, y0 = rng.randint(0, w), rng.randint(0, h)
            x1, y1 = rng.randint(0, w), rng.randint(0, h)
            draw.line((x0, y0, x1, y1), fill=spec.fg, width=rng.randint(2, 4))
        for _ in range(spec.clutter // 3):
            ch = rng.choice("AEKMRSWXZ")
            draw.text(
                (rng.randint(-10, w - 10), rng.randint(-10, h - 20)),
                ch,
                font=clutter_font,
                fill=spec.fg,
            )
    draw.text(
        (pad_x - left, pad_y - top),
        spec.text,
        font=fnt,
        fill=spec.fg,
        stroke_width=spec.stroke,
        stroke_fill=spec.stroke_fill,
    )
    if spec.rotate:
        img = img.rotate(
            spec.rotate, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=spec.bg
        )
    if spec.blur:
        img = img.filter(ImageFilter.GaussianBlur(spec.blur))
    if spec.noise:
        img = Image.blend(img, noise_layer(rng, img.size).convert("RGB"), spec.noise)
    return img


def render_amount(spec: AmountSpec, seed: int) -> Image.Image:
    """Render ``spec.text`` glyph by glyph with jitter, slant and a faint amount box."""
    rng = random.Random(seed)
    glyphs: list[Image.Image] = []
    for ch in spec.text:
        size = spec.size + rng.randint(-3, 3) if ch.isdigit() else spec.size // 2
        fnt = font(spec.font, size)
        left, top, right, bottom = bbox(fnt, ch)
        mask = Image.new("L", (right - left + 8, bottom - top + 8), 0)
        ImageDraw.Draw(mask).text((4 - left, 4 - top), ch, font=fnt, fill=255)
        angle = rng.uniform(-spec.jitter * 2, spec.jitter * 2)
        glyphs.append(mask.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True))
    cell_h = max(g.height for g in glyphs)
    width = int(sum(g.width * spec.advance for g in glyphs)) + 40
    height = cell_h + 28
    ink = Image.new("L", (width, height), 0)
    x = 18.0
    for ch, g in zip(spec.text, glyphs, strict=True):
        dy = rng.uniform(-spec.jitter, spec.jitter)
        y = height - 14 - g.height + dy if ch.isdigit() else height - 14 - g.height
        ink.paste(255, (int(x), int(y)), g)
        x += g.width * spec.advance + rng.uniform(-spec.jitter, spec.jitter) / 2
    if spec.slant:
        ink = ink.transform(
            ink.size,
            Image.Transform.AFFINE,
            (1, spec.slant, -spec.slant * height / 2, 0, 1, 0),
            resample=Image.Resampling.BICUBIC,
        )
    draw = ImageDraw.Draw(ink)
    for _ in range(spec.strike):
        y0, y1 = rng.randint(height // 4, 3 * height // 4), rng.randint(height // 4, height)
        draw.line((0, y0, width, y1), fill=255, width=rng.randint(3, 5))
    paper = Image.new("L", (width, height), spec.paper)
    pd = ImageDraw.Draw(paper)
    pd.rectangle((3, 3, width - 4, height - 4), outline=spec.paper - 50, width=1)
    img = Image.composite(Image.new("L", (width, height), spec.ink), paper, ink)
    if spec.rotate:
        img = img.rotate(
            spec.rotate, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=spec.paper
        )
    if spec.blur:
        img = img.filter(ImageFilter.GaussianBlur(spec.blur))
    if spec.noise:
        img = Image.blend(img, noise_layer(rng, img.size), spec.noise)
    return img


def choice_question(options: Sequence[str]) -> str:
    """The multiple-choice prompt, in the layout used by MMBench-style pools."""
    lines = [CHOICE_QUESTION, "Options:"]
    lines += [f"{letter}. {opt}" for letter, opt in zip(LETTERS, options, strict=True)]
    lines.append(CHOICE_SUFFIX)
    return "\n".join(lines)


def build_items() -> list[Item]:
    """Render every image and assemble the pool lines, in file order."""
    items: list[Item] = []
    for i, spec in enumerate(WORDS):
        png = png_bytes(render_word(spec, seed=1000 + i))
        items.append(
            Item(
                f"SynthWords-{i:04d}",
                "SynthWords",
                f"synthwords_{i:04d}.png",
                WORDS_QUESTION,
                spec.text,
                None,
                png,
                spec.hard,
            )
        )
    shared = items[SHARED_WORD]
    items.append(
        Item(
            f"SynthWords-{len(WORDS):04d}",
            "SynthWords",
            shared.image,
            WORDS_SECOND_QUESTION,
            shared.answer,
            None,
            shared.png,
            shared.hard,
        )
    )
    for i, amount in enumerate(AMOUNTS):
        png = png_bytes(render_amount(amount, seed=2000 + i))
        digits = re.sub(r"[^0-9]", "", amount.text)
        items.append(
            Item(
                f"SynthAmounts-{i:04d}",
                "SynthAmounts",
                f"synthamounts_{i:04d}.png",
                AMOUNTS_QUESTION,
                digits,
                None,
                png,
                amount.hard,
            )
        )
    for i, choice in enumerate(CHOICES):
        png = png_bytes(render_word(choice.word, seed=3000 + i))
        if choice.options[choice.answer] != choice.word.text:
            raise ValueError(f"choice {i}: option {choice.answer} is not {choice.word.text!r}")
        items.append(
            Item(
                f"SynthChoice-{i:04d}",
                "SynthChoice",
                f"synthchoice_{i:04d}.png",
                choice_question(choice.options),
                LETTERS[choice.answer],
                "mc",
                png,
                False,
            )
        )
    return items


def write_pool(out: Path, items: Sequence[Item]) -> None:
    """Write the images and ``items.jsonl`` into ``out``, removing stale generated images."""
    out.mkdir(parents=True, exist_ok=True)
    names = {item.image for item in items}
    for stale in out.glob("synth*_*.png"):
        if stale.name not in names:
            stale.unlink()
    written: set[str] = set()
    for item in items:
        if item.image not in written:
            (out / item.image).write_bytes(item.png)
            written.add(item.image)
    lines = [json.dumps(item.record(), ensure_ascii=False) for item in items]
    (out / "items.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def alnum(text: str) -> str:
    """Lowercase and keep only ``[a-z0-9]``, as the alnum protocol compares."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def check(items: Sequence[Item]) -> None:
    """Run RapidOCR recognition (no detection, no angle classifier) and print a table."""
    from rapidocr_onnxruntime import RapidOCR  # optional: only needed for --check

    engine = RapidOCR()
    stats: dict[str, list[int]] = {}
    print(f"{'id':<18} {'kind':<5} {'answer':<12} {'rapidocr':<18} {'score':>5}  ok")
    for item in items:
        result, _ = engine(item.png, use_det=False, use_cls=False)
        text, score = (str(result[0][0]), float(result[0][1])) if result else ("", 0.0)
        target = item.answer if item.protocol != "mc" else ""
        ok = bool(target) and alnum(text) == alnum(target)
        kind = "hard" if item.hard else ("mc" if item.protocol == "mc" else "easy")
        print(
            f"{item.id:<18} {kind:<5} {item.answer:<12} {text[:18]:<18} {score:5.2f}  "
            f"{'yes' if ok else 'no'}"
        )
        right_total = stats.setdefault(item.family, [0, 0])
        right_total[0] += ok
        right_total[1] += 1
    print()
    for family, (right, total) in stats.items():
        print(f"{family:<14} read right {right}/{total} ({100 * right / total:.0f}%)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="pool folder to write")
    parser.add_argument(
        "--check",
        action="store_true",
        help="also run RapidOCR recognition on every image and print a table",
    )
    args = parser.parse_args(argv)
    items = build_items()
    write_pool(args.out, items)
    print(f"wrote {len(items)} items, {len({i.image for i in items})} images to {args.out}")
    if args.check:
        check(items)
    return 0


if __name__ == "__main__":
    sys.exit(main())
