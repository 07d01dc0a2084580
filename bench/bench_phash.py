"""How well a 64-bit perceptual hash finds near-duplicates, on a folder of real images.

    .venv/bin/python -m bench.bench_phash FOLDER [--thresholds 4-16] [--methods phash,dhash,...]

Every image (png/jpg) in FOLDER (only read) is modified in memory: JPEG re-encoding at
quality 70/80/90, resizing by 0.5/0.75/1.25/1.5, cropping 2% and 5% from each side,
brightness x0.9 and x1.1, and two combinations (resize 0.75 + JPEG 80, crop 3% + brightness
1.1); one extra (5% cut from the left and top only) is reported but kept out of the overall
recall. Modified copies are stored losslessly (PNG) unless the transformation is a JPEG
re-encoding, so each measures only what it names.

For each hash method and each threshold t:
- recall: the fraction of modified copies whose hash lies within t bits of their own
  original's, per transformation and overall;
- false matches among the distinct originals (distinct sha256 and hash): the fraction of
  pairs of different originals within t bits, and the fraction of originals that have any
  other original within t bits.

Methods: `phash` is rsieve.hashindex.perceptual_hash (what rsieve indexes); the others are
imagehash alternatives on the same decoded image (`dhash`, `whash`, `phash_hf2`: phash from a
16x16 thumbnail, `phash_centre`: phash of the central 80%), and AND-combinations of two
(`phash+dhash`: a match needs both within their own threshold, each a 64-bit hash, so each
its own HashIndex). The recommendation: per method, the smallest threshold with overall
recall >= 0.95 and originals with a false match <= 1%, if any.

Prints the tables and writes bench/phash.json (git-ignored).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import imagehash
import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from rsieve.hashindex import perceptual_hash
from rsieve.images import IMAGE_FORMATS

HERE = Path(__file__).resolve().parent
RECALL_TARGET = 0.95
FALSE_TARGET = 0.01


# --------------------------------------------------------------------------- transformations


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _jpeg(img: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    img.convert("RGB").save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _resize(img: Image.Image, f: float) -> Image.Image:
    size = (max(1, round(img.width * f)), max(1, round(img.height * f)))
    return img.resize(size, Image.Resampling.LANCZOS)


def _crop(img: Image.Image, f: float, sides: str = "ltrb") -> Image.Image:
    dx, dy = round(img.width * f), round(img.height * f)
    box = (
        dx if "l" in sides else 0,
        dy if "t" in sides else 0,
        img.width - (dx if "r" in sides else 0),
        img.height - (dy if "b" in sides else 0),
    )
    if box[2] <= box[0] or box[3] <= box[1]:
        return img
    return img.crop(box)


def _bright(img: Image.Image, f: float) -> Image.Image:
    return ImageEnhance.Brightness(img).enhance(f)


TRANSFORMS: dict[str, Callable[[Image.Image], bytes]] = {
    "jpeg70": lambda im: _jpeg(im, 70),
    "jpeg80": lambda im: _jpeg(im, 80),
    "jpeg90": lambda im: _jpeg(im, 90),
    "resize0.5": lambda im: _png(_resize(im, 0.5)),
    "resize0.75": lambda im: _png(_resize(im, 0.75)),
    "resize1.25": lambda im: _png(_resize(im, 1.25)),
    "resize1.5": lambda im: _png(_resize(im, 1.5)),
    "crop2%": lambda im: _png(_crop(im, 0.02)),
    "crop5%": lambda im: _png(_crop(im, 0.05)),
    "bright0.9": lambda im: _png(_bright(im, 0.9)),
    "bright1.1": lambda im: _png(_bright(im, 1.1)),
    "resize0.75+jpeg80": lambda im: _jpeg(_resize(im, 0.75), 80),
    "crop3%+bright1.1": lambda im: _png(_bright(_crop(im, 0.03), 1.1)),
}
EXTRA: dict[str, Callable[[Image.Image], bytes]] = {
    "crop5%_left_top": lambda im: _png(_crop(im, 0.05, "lt")),
}


# --------------------------------------------------------------------------- hash methods


def _decode(data: bytes) -> Image.Image:
    """As rsieve.hashindex.perceptual_hash decodes: EXIF orientation, alpha on white."""
    img: Image.Image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    img.load()
    img = ImageOps.exif_transpose(img)
    if img.mode in {"RGBA", "LA", "PA"} or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    return img.convert("RGB")


def _int(h: imagehash.ImageHash) -> int:
    return int(str(h), 16)


def _centre(img: Image.Image, f: float = 0.10) -> Image.Image:
    return _crop(img, f)


IMAGE_HASHES: dict[str, Callable[[Image.Image], int]] = {
    "dhash": lambda im: _int(imagehash.dhash(im, hash_size=8)),
    "whash": lambda im: _int(imagehash.whash(im, hash_size=8)),
    "ahash": lambda im: _int(imagehash.average_hash(im, hash_size=8)),
    "phash_hf2": lambda im: _int(imagehash.phash(im, hash_size=8, highfreq_factor=2)),
    "phash_centre": lambda im: _int(imagehash.phash(_centre(im), hash_size=8)),
}


# Enrolment variants: the original is indexed under several hashes (phash of itself and of
# symmetric central crops), a copy is queried with its plain phash, and the distance is the
# nearest variant's. A crop of the original then meets a variant cropped alike. Each variant
# is one more 64-bit row in the same HashIndex; pool-to-pool duplicates need it on both
# sides only when either side may be the cropped one (enrol every image).
# The fractions are off the tested crops' (2%, 3%, 5%) where they can be; the crop sweep
# (every 0.5% from 0.5% to 8%, per side) shows recall between the enrolled fractions too.
# `phash_mc7` adds the four corners cut at 3.5% from two adjacent sides (one-sided crops
# shift the content as well as zooming it).
_SYM = "ltrb"
ENROL: dict[str, tuple[tuple[float, str], ...]] = {
    "phash_mc3": ((0.0, _SYM), (0.035, _SYM), (0.07, _SYM)),
    "phash_mc5": tuple((f, _SYM) for f in (0.0, 0.0175, 0.035, 0.0525, 0.07)),
    "phash_mc7": (
        (0.0, _SYM),
        (0.035, _SYM),
        (0.07, _SYM),
        *((0.035, sides) for sides in ("lt", "rt", "lb", "rb")),
    ),
}
SWEEP = tuple(round(0.005 * k, 4) for k in range(1, 17))
SWEEP_THRESHOLDS = (8, 10, 12)


def enrol_hashes(img: Image.Image, crops: tuple[tuple[float, str], ...]) -> list[int]:
    return [_int(imagehash.phash(_crop(img, f, sides), hash_size=8)) for f, sides in crops]


def hash_all(data: bytes, methods: list[str]) -> dict[str, int]:
    out = {}
    if "phash" in methods:
        out["phash"] = perceptual_hash(data)
    others = [m for m in methods if m != "phash"]
    if others:
        img = _decode(data)
        for m in others:
            out[m] = IMAGE_HASHES[m](img)
    return out


def popcount(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return ((x * np.uint64(0x0101010101010101)) >> np.uint64(56)).astype(np.int64)


# --------------------------------------------------------------------------- measuring


def table(
    mod_d: dict[str, np.ndarray],  # transformation -> (n,) distances to the originals
    pair_match: Callable[[int], np.ndarray],  # threshold -> (n, n) bool, diagonal False
    match: Callable[[str, int], np.ndarray],  # (transformation, threshold) -> (n,) bool
    thresholds: list[int],
    overall: list[str],
) -> list[dict[str, Any]]:
    rows = []
    for t in thresholds:
        per = {name: float(match(name, t).mean()) for name in mod_d}
        all_ = float(np.concatenate([match(name, t) for name in overall]).mean())
        pm = pair_match(t)
        n = len(pm)
        rows.append(
            {
                "threshold": t,
                "recall": per,
                "recall_overall": all_,
                "false_pair_rate": float(pm[np.triu_indices(n, 1)].mean()),
                "false_originals_rate": float(pm.any(axis=1).mean()),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--thresholds", default="4-16", help="range a-b or a list a,b,c")
    ap.add_argument(
        "--methods",
        default="phash,dhash,whash,ahash,phash_hf2,phash_centre",
        help="single hashes (phash, dhash, whash, ahash, phash_hf2, phash_centre)",
    )
    ap.add_argument(
        "--pairs",
        default="phash+dhash,phash+whash,phash_centre+dhash",
        help="AND-combinations of two methods to search (each within its own threshold)",
    )
    ap.add_argument("--out", type=Path, default=HERE / "phash.json")
    args = ap.parse_args()
    if "-" in args.thresholds:
        a, b = args.thresholds.split("-")
        thresholds = list(range(int(a), int(b) + 1))
    else:
        thresholds = [int(x) for x in args.thresholds.split(",")]
    methods = [m for m in args.methods.split(",") if m]
    if "phash" not in methods:
        methods.insert(0, "phash")  # the enrolment methods query with it
    pairs = [tuple(p.split("+")) for p in args.pairs.split(",") if p]
    for p in pairs:
        for m in p:
            if m not in methods:
                methods.append(m)

    files = sorted(
        p for p in args.folder.iterdir() if p.suffix.lower() in {".png", ".jpg", ".jpeg"}
    )
    t0 = time.perf_counter()
    seen: set[str] = set()
    originals: list[dict[str, int]] = []
    copies: dict[str, list[dict[str, int]]] = {t: [] for t in (*TRANSFORMS, *EXTRA)}
    names: list[str] = []
    enrolled: list[dict[str, list[int]]] = []
    sweep: dict[float, list[int]] = {f: [] for f in SWEEP}
    skipped: list[str] = []
    for path in files:
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        if sha in seen:
            skipped.append(f"{path.name} (same bytes as another)")
            continue
        seen.add(sha)
        try:
            base = hash_all(data, methods)
            img = _decode(data)
        except Exception as exc:  # noqa: BLE001 - report and go on
            skipped.append(f"{path.name} ({type(exc).__name__}: {exc})")
            continue
        names.append(path.name)
        originals.append(base)
        enrolled.append({m: enrol_hashes(img, fr) for m, fr in ENROL.items()})
        for t, fn in (*TRANSFORMS.items(), *EXTRA.items()):
            copies[t].append(hash_all(fn(img), methods))
        for f in SWEEP:
            sweep[f].append(perceptual_hash(_png(_crop(img, f))))
    n = len(originals)
    elapsed = time.perf_counter() - t0
    datas = [(args.folder / name).read_bytes() for name in names]
    t1 = time.perf_counter()
    for data in datas:
        perceptual_hash(data)
    per_image_ms = (time.perf_counter() - t1) / max(n, 1) * 1e3
    print(
        f"{args.folder}: {n} distinct originals ({len(skipped)} skipped), "
        f"{n * (len(TRANSFORMS) + len(EXTRA))} modified copies, {len(methods)} hashes each, "
        f"{elapsed:.1f} s"
    )
    for s in skipped:
        print(f"  skipped {s}")
    print(f"perceptual_hash: {per_image_ms:.2f} ms per original (decode included)")

    orig = {m: np.array([o[m] for o in originals], dtype=np.uint64) for m in methods}
    enrol = {m: np.array([e[m] for e in enrolled], dtype=np.uint64) for m in ENROL}
    copy_phash = {
        t: np.array([c["phash"] for c in cs], dtype=np.uint64) for t, cs in copies.items()
    }
    dist = {
        m: {
            t: popcount(orig[m] ^ np.array([c[m] for c in cs], dtype=np.uint64))
            for t, cs in copies.items()
        }
        for m in methods
    }
    pair = {}
    for m in methods:
        d = popcount(orig[m][:, None] ^ orig[m][None, :])
        np.fill_diagonal(d, 99)
        pair[m] = d
    # Identical hashes between different originals: images that are really the same
    # picture (a note, not a false match the hash can avoid) are listed.
    same = (
        [
            (names[i], names[j])
            for i, j in zip(*np.nonzero(np.triu(pair["phash"] == 0, 1)), strict=True)
        ]
        if "phash" in pair
        else []
    )

    overall = list(TRANSFORMS)
    results: dict[str, Any] = {
        "folder": str(args.folder),
        "originals": n,
        "pairs": n * (n - 1) // 2,
        "transforms": overall,
        "extra_transforms": list(EXTRA),
        "identical_phash_pairs": same,
        "perceptual_hash_ms_per_image": round(per_image_ms, 3),
        "methods": {},
        "combined": {},
    }

    def single_rows(m: str) -> list[dict[str, Any]]:
        return table(
            dist[m],
            lambda t: pair[m] <= t,
            lambda name, t: dist[m][name] <= t,
            thresholds,
            overall,
        )

    def recommend(rows: list[dict[str, Any]], every: bool = False) -> dict[str, Any] | None:
        """The first row meeting the target: overall recall (or, with `every`, the recall of
        every listed transformation) >= 0.95 and <= 1% of originals falsely matched."""
        for r in rows:
            recall = min(r["recall"][x] for x in overall) if every else r["recall_overall"]
            if recall >= RECALL_TARGET and r["false_originals_rate"] <= FALSE_TARGET:
                return r
        return None

    # Enrolment: distances to the nearest variant (copies and other originals queried with
    # their plain phash; an original pair counts in either direction).
    for m, var in enrol.items():
        dist[m] = {t: popcount(var ^ copy_phash[t][:, None]).min(axis=1) for t in copies}
        d = popcount(var[:, :, None] ^ orig["phash"][None, None, :]).min(axis=1)
        d = np.minimum(d, d.T)
        np.fill_diagonal(d, 99)
        pair[m] = d
    methods_all = [*methods, *enrol]

    # The closest pairs of different originals (what a false match would be).
    ones = popcount(orig["phash"])
    balanced = float((ones == 32).mean())
    results["phash_32_bits_set"] = balanced
    print(
        f"phash hashes with exactly 32 of 64 bits set: {balanced:.1%} (the DCT median splits "
        "them: distances between two such hashes are even)"
    )
    closest = []
    for m in ("phash", *enrol):
        d = pair[m]
        iu = np.triu_indices(n, 1)
        order = np.argsort(d[iu], kind="stable")[:5]
        closest.append((m, [(names[iu[0][k]], names[iu[1][k]], int(d[iu][k])) for k in order]))
    results["closest_original_pairs"] = dict(closest)
    for m, ps in closest:
        print(f"closest originals by {m}: " + "; ".join(f"{a} ~ {b}: {dd}" for a, b, dd in ps))

    for m in methods_all:
        rows = single_rows(m)
        rec, every = recommend(rows), recommend(rows, every=True)
        results["methods"][m] = {
            "rows": rows,
            "recommended": rec and rec["threshold"],
            "recommended_every_transform": every and every["threshold"],
        }
        print_table(m, rows, rec, every)

    # AND-combinations: a match needs both hashes within their own thresholds.
    for a, b in pairs:
        grid: list[dict[str, Any]] = []
        for ta, tb in itertools.product(thresholds, thresholds):
            per = {
                name: float(((dist[a][name] <= ta) & (dist[b][name] <= tb)).mean())
                for name in dist[a]
            }
            rec_all = float(
                np.concatenate([(dist[a][x] <= ta) & (dist[b][x] <= tb) for x in overall]).mean()
            )
            pm = (pair[a] <= ta) & (pair[b] <= tb)
            grid.append(
                {
                    "thresholds": [ta, tb],
                    "recall": per,
                    "recall_overall": rec_all,
                    "false_pair_rate": float(pm[np.triu_indices(n, 1)].mean()),
                    "false_originals_rate": float(pm.any(axis=1).mean()),
                }
            )
        ok = [
            g
            for g in grid
            if g["recall_overall"] >= RECALL_TARGET and g["false_originals_rate"] <= FALSE_TARGET
        ]
        best = max(
            grid, key=lambda g: (g["false_originals_rate"] <= FALSE_TARGET, g["recall_overall"])
        )
        pick = (
            min(ok, key=lambda g: (g["false_originals_rate"], sum(g["thresholds"]))) if ok else None
        )
        results["combined"][f"{a}+{b}"] = {
            "grid": grid,
            "recommended": pick and pick["thresholds"],
            "best_recall_within_false_target": best,
        }
        head = f"{a}+{b} (both within their thresholds)"
        print(
            f"\n{head}: best recall with originals falsely matched <= {FALSE_TARGET:.0%}: "
            f"{best['recall_overall']:.3f} at {best['thresholds']} "
            f"(false originals {best['false_originals_rate']:.3f}, crop5% "
            f"{best['recall']['crop5%']:.3f})"
        )
        if pick:
            print(
                f"{head}: meets the target at {a}<={pick['thresholds'][0]}, "
                f"{b}<={pick['thresholds'][1]}: "
                f"recall {pick['recall_overall']:.3f}, originals with a false match "
                f"{pick['false_originals_rate']:.3f}, false pairs {pick['false_pair_rate']:.5f}"
            )
        else:
            print(f"{head}: no pair of thresholds meets the target")

    # Crop sweep: recall of symmetric crops by fraction, plain phash and the enrolments.
    enrolled_by: dict[str, np.ndarray] = {"phash": orig["phash"][:, None], **enrol}
    cols = [(m, t) for m in enrolled_by for t in SWEEP_THRESHOLDS]
    print("\ncrop sweep (per side), recall; columns method@threshold")
    print("  crop " + " ".join(f"{m.replace('phash', 'ph')}@{t:<2d}".rjust(11) for m, t in cols))
    sweep_rows = []
    for f in SWEEP:
        q = np.array(sweep[f], dtype=np.uint64)[:, None]
        row = {
            f"{m}@{t}": float((popcount(enrolled_by[m] ^ q).min(axis=1) <= t).mean())
            for m, t in cols
        }
        sweep_rows.append({"crop": f, **row})
        print(f"  {f:4.1%} " + " ".join(f"{row[f'{m}@{t}']:11.3f}" for m, t in cols))
    results["crop_sweep"] = sweep_rows

    summary: dict[str, Any] = {}
    print(
        "\nrecommended: the smallest threshold with <= 1% of originals falsely matched and"
        " recall >= 0.95 overall / for every listed transformation"
    )
    for m, r in results["methods"].items():
        summary[m] = [r["recommended"], r["recommended_every_transform"]]
    for m, r in results["combined"].items():
        summary[m] = [r["recommended"], None]
    for m, (a, b) in summary.items():
        print(
            f"  {m:22s} {'none' if a is None else str(a):>10s} "
            f"{'none' if b is None else str(b):>10s}"
        )
    results["summary"] = summary
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


def print_table(
    method: str,
    rows: list[dict[str, Any]],
    rec: dict[str, Any] | None,
    every: dict[str, Any] | None,
) -> None:
    names = list(rows[0]["recall"])
    short = {
        n: n.replace("resize", "rs").replace("bright", "br").replace("jpeg", "jq") for n in names
    }
    print(
        f"\n{method}: recall per transformation, overall (extra: {', '.join(EXTRA)} "
        "excluded), false matches"
    )
    head = "  t " + " ".join(f"{short[n]:>8.8s}" for n in names) + "  overall  fpairs  forig"
    print(head)
    for r in rows:
        cells = " ".join(f"{r['recall'][n]:8.3f}" for n in names)
        print(
            f" {r['threshold']:2d} {cells}  {r['recall_overall']:7.3f} {r['false_pair_rate']:7.4f} "
            f"{r['false_originals_rate']:6.3f}"
        )
    if rec:
        print(
            f" -> {method}: threshold {rec['threshold']} meets overall recall >= 0.95, "
            "false originals <= 1%"
        )
    else:
        print(f" -> {method}: no threshold meets recall >= 0.95 with false originals <= 1%")
    if every:
        print(f" -> {method}: threshold {every['threshold']} gives every transformation >= 0.95")
    else:
        print(f" -> {method}: no threshold gives every transformation recall >= 0.95")


if __name__ == "__main__":
    main()
