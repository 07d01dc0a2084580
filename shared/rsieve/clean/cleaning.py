"""Cleaning rules: pool lines to validated items, or to a quarantine with a reason.

Pure: the shell hands in bytes (a pool line, an image) and gets back an `Item` or a
`Quarantined`. The decisions that need the whole pool (exact duplicate items, task purity,
...) are taken at ingest, in the rounds of `rsieve.clean.ingestion`, the one
implementation of each; `cleaning_report` writes their measurement and `render_cleaning`
renders it. Images are inspected with a pixel limit before any decode.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from PIL import Image
from pydantic import ValidationError

from rsieve.clean.prompts import build_question
from rsieve.clean.purity import EMBEDDING_MODEL, PURITY_VERSION
from rsieve.families import protocol_for
from rsieve.images import IMAGE_FORMATS
from rsieve.mcq import normalise_mcq
from rsieve.run.shards import PoolLine
from rsieve.schemas import Item, PoolItem, Quarantined
from rsieve.verify import PROTOCOLS

__all__ = [
    "POLICY_VERSION",
    "Provenance",
    "clean_item",
    "clean_line",
    "cleaning_report",
    "family_items",
    "inspect_image",
    "line_image_path",
    "parse_line",
    "poisoned_line",
    "pool_image_path",
    "render_cleaning",
    "upload_refusal",
]

POLICY_VERSION = "clean/2"


def _quarantine(
    line: int,
    reason: str,
    detail: str = "",
    *,
    item_id: str | None = None,
    family: str | None = None,
) -> Quarantined:
    return Quarantined(
        id=item_id, line=line, family=family, stage="clean", reason=reason, detail=detail[:500]
    )


# Why the pool reader could not turn a conversation row into items (rsieve.adapters.pools):
# it writes one line `{"id", "family", "source", "unsupported": <reason>}` for the row (or
# the pair), and the line is quarantined with that reason.
UNSUPPORTED_ROWS = ("multi_image", "no_image", "unsupported_turn", "invalid_json")


def parse_line(raw: bytes, line: int, *, text_max_chars: int) -> PoolItem | Quarantined:
    """One line of items.jsonl (1-based `line`) to a PoolItem, or why not. A line with
    `unsupported` (a row the pool reader could not honour) is quarantined with that reason
    (one of UNSUPPORTED_ROWS; another is `invalid_item`)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _quarantine(line, "invalid_utf8", str(exc))
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return _quarantine(line, "invalid_json", str(exc))
    if not isinstance(obj, dict):
        return _quarantine(line, "invalid_json", f"a JSON {type(obj).__name__}, not an object")
    item_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    family = obj.get("family") if isinstance(obj.get("family"), str) else None
    if obj.get("unsupported") is not None:  # a row the pool reader could not honour
        why, detail = obj["unsupported"], obj.get("unsupported_detail")
        detail = detail if isinstance(detail, str) else ""
        if why not in UNSUPPORTED_ROWS:  # a reason this version does not know (newer reader)
            why, detail = "invalid_item", f"unsupported: {str(why)[:100]}; {detail}"
        return _quarantine(line, why, detail, item_id=item_id, family=family)
    try:
        item = PoolItem.model_validate(obj)
    except ValidationError as exc:
        fields = ", ".join(".".join(map(str, e["loc"])) for e in exc.errors())
        return _quarantine(
            line, "invalid_item", f"bad fields: {fields}", item_id=item_id, family=family
        )
    refs = [item.answer] if isinstance(item.answer, str) else list(item.answer)
    if not item.question.strip():
        return _quarantine(line, "empty_question", item_id=item.id, family=item.family)
    if not refs or not all(r.strip() for r in refs):
        return _quarantine(line, "empty_answer_reference", item_id=item.id, family=item.family)
    if len(item.question) > text_max_chars or sum(map(len, refs)) > text_max_chars:
        return _quarantine(
            line,
            "text_too_long",
            f"limit {text_max_chars} characters",
            item_id=item.id,
            family=item.family,
        )
    return item


def pool_image_path(image: str) -> str | None:
    """The image's path inside the pool folder, or None when it would leave the folder."""
    if image.startswith(("/", "\\")) or "\\" in image or ":" in image.split("/", 1)[0]:
        return None
    norm = posixpath.normpath(image)
    if norm == ".." or norm.startswith("../") or norm in (".", ""):
        return None
    return norm


def inspect_image(data: bytes, *, max_pixels: int, max_bytes: int) -> tuple[str, str] | None:
    """(reason, detail) if the bytes are not an acceptable image, else None.

    The header is read first and the pixel count checked before any pixel is decoded."""
    if not data:  # the detail says which kind of unreadable: tests and reports group by it
        return "unreadable_image", "empty file (0 bytes)"
    if len(data) > max_bytes:
        return "image_too_large", f"{len(data)} bytes > {max_bytes}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
                width, height = img.size
                if width * height > max_pixels:
                    return "image_too_large", f"{width}x{height} > {max_pixels} pixels"
                img.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        return "image_too_large", str(exc)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is the item's fault
        if "truncated" in str(exc) or isinstance(exc, EOFError):
            return "unreadable_image", f"truncated: {type(exc).__name__}: {exc}"
        return "unreadable_image", f"{type(exc).__name__}: {exc}"
    return None


def clean_item(
    item: PoolItem,
    *,
    line: int,
    image_sha256: str,
    provenance_check: str,
    policy: str,
    pool_uri: str,
    policy_extra: dict[str, Any] | None = None,
    purity: str | None = None,
) -> Item | Quarantined:
    """A validated pool item to the item the model sees: the family's protocol, multiple
    choice normalised (mcq.py), the instruction appended, every decision in clean_meta."""
    protocol = protocol_for(item.family, item.protocol)
    if protocol is None or protocol not in PROTOCOLS:
        return _quarantine(
            line,
            "unknown_protocol",
            f"family {item.family!r} protocol {protocol!r}",
            item_id=item.id,
            family=item.family,
        )
    question, answer, mcq_meta = item.question, item.answer, None
    if protocol == "mc":
        mcq = normalise_mcq(item.question, item.answer, item.options)
        question, answer = mcq.question, mcq.answer
        mcq_meta = mcq.meta(item.question, item.answer)
    refs = [answer] if isinstance(answer, str) else list(answer)
    meta: dict[str, Any] = {
        "pool": pool_uri,
        "line": line,
        "source": item.source,
        "provenance": provenance_check,
        "policy": {"version": POLICY_VERSION, "provenance": policy, **(policy_extra or {})},
    }
    if mcq_meta is not None:
        meta["mcq"] = mcq_meta
    if purity is not None:
        meta["purity"] = purity
    return Item(
        id=item.id,
        line=line,
        family=item.family,
        protocol=protocol,
        question=build_question(question, protocol),
        pool_question=item.question,
        references=refs,
        options=item.options,
        image_sha256=image_sha256,
        clean_meta=meta,
    )


def line_image_path(pool_line: PoolLine) -> str | None:
    """The pool path of the image a line names, if it names one inside the pool."""
    try:
        image = json.loads(pool_line.raw).get("image")
    except (ValueError, AttributeError):
        return None
    return pool_image_path(image) if isinstance(image, str) else None


def poisoned_line(pool_line: PoolLine) -> Quarantined:
    """The quarantine of a line that killed its worker at every delivery (ItemGuard)."""
    try:
        obj = json.loads(pool_line.raw)
    except ValueError:
        obj = {}
    obj = obj if isinstance(obj, dict) else {}
    item_id, family = obj.get("id"), obj.get("family")
    return Quarantined(
        id=item_id if isinstance(item_id, str) else None,
        line=pool_line.line,
        family=family if isinstance(family, str) else None,
        stage="clean",
        reason="max_deliveries",
        detail="the worker died on this line each time",
    )


Provenance = Callable[[Any, str], tuple[bool, str]]  # (source, image sha256) -> (admitted, check)


def clean_line(
    pool_line: PoolLine,
    images: Mapping[str, bytes],
    *,
    pool_uri: str,
    text_max_chars: int,
    max_pixels: int,
    max_bytes: int,
    policy: str,
    purity_threshold: float,
    provenance: Provenance,
) -> Item | Quarantined:
    """One pool line through the clean stage's checks, in order; the first that fails is
    the line's quarantine reason (docs/cleaning.md): UTF-8, the item's fields, a duplicate
    id, the image inside the pool and uploaded, readable and within bounds, its bytes
    matching the pack index, provenance, a protocol, then the whole-pool verdicts taken at
    ingest (duplicate_item, off_task). `images`: the shard's image bytes by sha256."""
    line = pool_line.line
    if not pool_line.utf8:
        return Quarantined(id=None, line=line, family=None, stage="clean", reason="invalid_utf8")
    parsed = parse_line(pool_line.raw.encode(), line, text_max_chars=text_max_chars)
    if isinstance(parsed, Quarantined):
        return parsed

    def quarantine(reason: str, detail: str = "") -> Quarantined:
        return Quarantined(
            id=parsed.id,
            line=line,
            family=parsed.family,
            stage="clean",
            reason=reason,
            detail=detail,
        )

    if pool_line.duplicate_of is not None:
        return quarantine("duplicate_id", f"first on line {pool_line.duplicate_of}")
    path = pool_image_path(parsed.image)
    if path is None:
        return quarantine("image_outside_pool", parsed.image)
    if pool_line.verdict and pool_line.verdict[0] in UPLOAD_REFUSALS:
        return quarantine(*pool_line.verdict)
    ref = pool_line.image
    if ref is None or ref.sha256 not in images:
        return quarantine("missing_image", path)
    data = images[ref.sha256]
    if problem := inspect_image(data, max_pixels=max_pixels, max_bytes=max_bytes):
        return quarantine(*problem)
    sha = hashlib.sha256(data).hexdigest()
    if sha != ref.sha256:
        return quarantine("image_digest_mismatch", f"{path}: index {ref.sha256}, bytes {sha}")
    admitted, check = provenance(parsed.source, sha)
    if not admitted:
        return quarantine("provenance", check)
    item = clean_item(
        parsed,
        line=line,
        image_sha256=sha,
        provenance_check=check,
        policy=policy,
        pool_uri=pool_uri,
        purity=pool_line.purity,
        policy_extra={"purity": PURITY_VERSION, "purity_threshold": purity_threshold},
    )
    if isinstance(item, Item) and pool_line.verdict:  # duplicate_item, off_task
        return quarantine(*pool_line.verdict)
    return item.model_copy(update={"image_at": ref}) if isinstance(item, Item) else item


# Why the upload left an image file out (`_refused.json`): the cleaner quarantines each
# line naming one with this reason before it looks for the image.
UPLOAD_REFUSALS = ("image_symlink", "image_too_large")


def upload_refusal(why: str | Mapping[str, str]) -> tuple[str, str]:
    """(reason, detail) of a file the upload refused: `_refused.json` maps its path to
    {"reason", "detail"}; a bare string (a pool uploaded before images over the byte limit
    were refused at upload) is a symbolic link leaving the pool folder."""
    if isinstance(why, str):
        return "image_symlink", why
    reason, detail = why.get("reason", ""), why.get("detail", "")
    if reason in UPLOAD_REFUSALS:
        return reason, detail
    # A reason this version does not know (a newer uploader): refused all the same.
    return "image_symlink", f"{reason}: {detail}"


def cleaning_report(
    families: Mapping[str, Mapping[str, Any]],
    duplicates: Mapping[str, int],
    *,
    refused: Mapping[str, str | Mapping[str, str]],
    provenance_policy: str,
    purity_threshold: float,
    purity_min_items: int,
    purity_origins: Mapping[str, Sequence[str]] | None,
    embedded: bool,
    screen: Mapping[str, object] | None,
) -> dict[str, Any]:
    """runs/<run>/cleaning.json from the measured families (family -> {"purity", "mcq"})
    and the duplicate_item verdicts per family."""
    out: dict[str, Any] = {
        family: {**fam, "duplicate_items": duplicates.get(family, 0)}
        for family, fam in families.items()
    }
    for family, n in duplicates.items():  # a family whose every item was a duplicate
        out.setdefault(family, {"purity": None, "mcq": {}, "duplicate_items": n})
    report = {
        "version": POLICY_VERSION,
        "policy": {
            "provenance": provenance_policy,
            "purity": PURITY_VERSION,
            "purity_threshold": purity_threshold,
            "purity_min_items": purity_min_items,
            "purity_origins": {
                k: sorted({" ".join(str(o).split()).lower() for o in v})
                for k, v in sorted((purity_origins or {}).items())
            },
            "embedding_model": EMBEDDING_MODEL if embedded else None,
        },
        "files_refused": dict(sorted(refused.items())),
        "families": dict(sorted(out.items())),
    }
    if screen is not None:
        report["screen"] = dict(screen)
    return report


def family_items(report: Mapping[str, Any]) -> dict[str, int]:
    """Per family, the items a cleaning report (`cleaning_report`) admits past the
    whole-pool decisions (its purity measurement's `kept`): the family sizes known when the
    pool is planned, recorded in the run's shards.json for the judge's calibration rates
    (rsieve.judge.probes.calibration_rates). An upper bound: the clean stage's checks of
    each line (its image) may quarantine some of them yet."""
    return {
        family: int(fam["purity"]["kept"])
        for family, fam in sorted((report.get("families") or {}).items())
        if fam.get("purity") and fam["purity"].get("kept")
    }


def _purity_md(policy: Mapping[str, Any], families: Mapping[str, Any]) -> list[str]:
    """How task purity settles each item, and per family what it measured."""
    out = [
        "### Task purity",
        "",
        f"Each family's items are settled first by origin (the source dataset: an item of "
        f"another dataset than the family's benchmark origin, set per family or the "
        f"dominant one, is off-task), then by benchmark templates, the family's dominant "
        f"question form in the pool, the family's one exact question where it asks only "
        f"one and, for the rest, the sentence-embedding model "
        f"{policy.get('embedding_model') or '(not used)'}. Items of another origin and "
        f"exceptions to a family's one exact question are always quarantined as "
        f"`off_task`; the other off-task items only where the family's off-task share "
        f"exceeds {policy.get('purity_threshold', 0):.0%} (and it has at least "
        f'{policy.get("purity_min_items")} items). "decided by" counts the items each '
        f"rule settled.",
        "",
        "| family | items | off-task | share | threshold | kept | dropped | origin | "
        "decided by | examples |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for family, fam in families.items():
        p = fam.get("purity")
        if not p:
            continue
        examples = "; ".join(
            e["question"].replace("|", "/").replace("\n", " ")[:60] for e in p["examples"][:3]
        )
        share = f"{p['share']:.1%}" if p["measured"] or p["off_task"] else "not measured"
        origin = p.get("origin") or {}
        bench = ", ".join(origin.get("benchmark") or []).replace("|", "/")
        origin_cell = f"{bench} ({origin.get('by')})" if bench else "-"
        decided = ", ".join(f"{rule} {n}" for rule, n in p.get("by_rule", {}).items())
        out.append(
            f"| {family} | {p['items']} | {p['off_task']} | {share} | "
            f"{p['threshold']:.0%} | {p['kept']} | {p['dropped']} | {origin_cell} | "
            f"{decided or '-'} | {examples} |"
        )
    return out


def _profiles_md(families: Mapping[str, Any]) -> list[str]:
    """The families judged with the dataset's profile of their task, and any task drift."""
    memory = []
    for family, fam in families.items():
        p = fam.get("purity")
        if not (p and (p.get("dataset_profile") or p.get("drift"))):
            continue
        held = p.get("dataset_profile") or {}
        line = (
            f"- {family}: judged with the dataset's profile of {held.get('items', 0)} "
            f"on-task items from {held.get('runs', 0)} earlier run(s)."
        )
        drift = p.get("drift")
        if drift:
            line += (
                f" **Task drift**: this pool's {drift['pool_items']} on-task items make "
                f"{str(drift['becomes'])[:80]!r} the family's dominant question form, "
                f"which was {str(drift['dominant_form'])[:80]!r}."
            )
        memory.append(line)
    if not memory:
        return []
    return [
        "The dataset remembers each family's task (rsieve.clean.profiles): a family "
        "already in the dataset was judged with its profile as well as this pool's items.",
        "",
        *memory,
    ]


def _mcq_md(families: Mapping[str, Any]) -> list[str]:
    rows = [
        f"| {family} | "
        + " | ".join(
            str(fam["mcq"].get(k, 0)) for k in ("normalised", "lettered", "ambiguous", "none")
        )
        + " |"
        for family, fam in families.items()
        if fam.get("mcq")
    ]
    if not rows:
        return []
    return [
        "### Multiple-choice normalisation",
        "",
        "| family | re-rendered | already lettered | ambiguous (left, flagged) | no options |",
        "|---|---|---|---|---|",
        *rows,
    ]


def _duplicates_md(families: Mapping[str, Any]) -> list[str]:
    rows = [
        f"| {family} | {fam['duplicate_items']} |"
        for family, fam in families.items()
        if fam.get("duplicate_items")
    ]
    if not rows:
        return []
    return [
        "### Exact duplicates (same image sha256, same question; first kept)",
        "",
        "| family | quarantined |",
        "|---|---|",
        *rows,
    ]


def _refused_md(report: Mapping[str, Any]) -> list[str]:
    if not report.get("files_refused"):
        return []
    return [
        f"Files refused at upload: {len(report['files_refused'])} "
        "(symbolic links leaving the pool folder, or images over the byte limit)."
    ]


def _screen_md(screen: Mapping[str, Any] | None) -> list[str]:
    """Decontamination against the evaluation sets and near-duplicates of earlier items."""
    if not screen:
        return []
    sets = screen.get("evalsets") or {}
    out = [
        "### Decontamination and near-duplicates",
        "",
        "Each image's perceptual hash was compared, before any model call, with the "
        "images of every registered evaluation set and with the pool's earlier lines and "
        f"the {screen.get('committed_runs', 0)} run(s) already in the dataset: within "
        f"{screen.get('near_duplicate_distance')} of 64 bits is a match. An evaluation-set "
        f"match ({screen.get('evalset_match')}) is quarantined `contaminated`; the same "
        "question and answer on a near-duplicate image, `duplicate_item`.",
        "",
    ]
    if not sets:
        return [*out, "No evaluation set was registered."]
    return [
        *out,
        "| evaluation set | items quarantined |",
        "|---|---|",
        *[f"| {name} | {n} |" for name, n in sets.items()],
    ]


def render_cleaning(report: Mapping[str, Any]) -> list[str]:
    """Markdown lines for the card (and anyone reading runs/<run>/cleaning.json): the
    per-family task-purity measurement, multiple-choice normalisation and duplicates, in
    sections one blank line apart (a section with nothing to say left out)."""
    families = report.get("families", {})
    sections = [
        _purity_md(report.get("policy", {}), families),
        _profiles_md(families),
        _mcq_md(families),
        _duplicates_md(families),
        _refused_md(report),
        _screen_md(report.get("screen")),
    ]
    out: list[str] = []
    for lines in sections:
        if lines:
            out += [*([""] if out else []), *lines]
    return out
