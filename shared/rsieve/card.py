"""The dataset card (README.md): YAML `configs` and `dataset_info` for every split, then how
the data was produced, the rules with their constants, the judge and its calibration, the
cleaning, the counts and example rows with their images."""

from __future__ import annotations

import json
from typing import Any

import datasets
import yaml

from rsieve.judge import TEMPLATE_SHA256
from rsieve.rows import FEATURES
from rsieve.schemas import QUARANTINE_REASONS, REJECT_REASONS
from rsieve.verify import PROTOCOLS

__all__ = ["card_front_matter", "render_card"]


def _cell(value: object) -> str:
    """Markdown table cell text: pipes and backticks would break the table."""
    return str(value).replace("|", "\\|").replace("`", "'").replace("\n", " ")


def card_front_matter(manifest: dict[str, Any]) -> dict[str, Any]:
    files: dict[str, list[str]] = {}
    for shard in manifest["shards"]:
        files.setdefault(shard["split"], []).append(shard["path"])
    info = datasets.DatasetInfo(features=FEATURES)._to_yaml_dict()
    info["splits"] = [{"name": split, "num_examples": rows}
                      for split, rows in manifest["splits"].items()]
    return {
        "configs": [{
            "config_name": "default",
            "data_files": [{"split": s, "path": paths} for s, paths in sorted(files.items())],
        }],
        "dataset_info": info,
        "tags": ["rejection-sampling", "vision-language", "sft"],
    }


def render_card(*, dataset: str, spec: dict[str, Any], report: dict[str, Any],
                manifest: dict[str, Any], split_families: dict[str, str],
                examples: dict[str, list[tuple[dict[str, Any], str]]],
                calibration_md: str = "", cleaning_md: str = "") -> str:
    settings = spec["settings"]
    front = yaml.safe_dump(card_front_matter(manifest), sort_keys=False, allow_unicode=True)
    out = ["---", front.strip(), "---", "", f"# {dataset}", "",
           "Rejection-sampled supervised fine-tuning data for vision-language models, made "
           "by rsieve. Train on `answer` in the `_RS_think` / `_RS_nothink` splits; the "
           "`_rejected` splits are training data too: `answer` is the official reference and "
           "`wrong_vlm` what the model said instead.", "",
           "```python", "import datasets", f'ds = datasets.load_dataset("{dataset}")', "```",
           "", "## How the data was produced", "",
           f"Model `{settings['generator_model']}` answered every question at temperature "
           f"{settings['temperature']} with reasoning requested. The `question` field is "
           "byte-identical to the prompt the model received, appended instruction included. "
           "Each answer (the text after the reasoning) was compared with the reference by the "
           "family's protocol, tried whole, as its first line and as its first paragraph. "
           "Matches go to `<Family>_RS_think` (with the reasoning) and `<Family>_RS_nothink`. "
           "Every rejection went to a text-only judge "
           f"(`{settings['judge_model']}`, prompt template sha256 `{TEMPLATE_SHA256[:16]}`) "
           "that sees question, reference and candidate, never the image, and answers CORRECT, "
           "WRONG or UNSURE. Only CORRECT promotes; WRONG and UNSURE stay in "
           "`<Family>_rejected`.", "",
           "In accepted splits `answer` is the model's own verified output and `org_answer` "
           "the reference; each entry records the verifier decision (protocol, version, "
           "variant, score) or the judge verdict that promoted it.", "",
           "## Verification protocols", "",
           "| protocol | version | accept at score | constants |", "|---|---|---|---|"]
    used = sorted(spec.get("protocols_used") or PROTOCOLS)
    for name in used:
        p = PROTOCOLS[name]
        out.append(f"| `{name}` | {p.version} | >= {p.threshold} | "
                   f"{_cell(json.dumps(p.constants, ensure_ascii=False))} |")
    if calibration_md.strip().startswith("## "):
        out += ["", calibration_md.strip()]
    else:
        out += ["", "## Judge calibration", "",
                calibration_md.strip() or "No calibration was recorded for this run."]
    out += ["", "## Cleaning applied", "",
            "Items are quarantined (listed in `quarantine.jsonl` with id, pool line, family, "
            "stage and reason) and never reach a split when:", ""]
    out += [f"- `{k}`: {v}" for k, v in QUARANTINE_REASONS.items()]
    out += ["", f"Provenance policy: `{settings.get('provenance_policy', 'strict')}`."]
    if cleaning_md.strip():
        out += ["", cleaning_md.strip()]
    out += ["", "Rejected-split reasons:", ""]
    out += [f"- `{k}`: {v}" for k, v in REJECT_REASONS.items()]
    out += ["", "## Counts", "", "| split | family | rows (images) |", "|---|---|---|"]
    out += [f"| `{s}` | {_cell(split_families.get(s, ''))} | {n} |"
            for s, n in manifest["splits"].items()]
    out += ["", f"Latest run `{report['run']}`:", "",
            "| family | items in | accepted (by judge) | rejected | quarantined |",
            "|---|---|---|---|---|"]
    for fam, r in report["families"].items():
        out.append(f"| {_cell(fam)} | {r['in']} | {r['accepted']} ({r['promoted_by_judge']}) | "
                   f"{r['rejected']} {_cell(json.dumps(r['rejected_by_reason']))} | "
                   f"{r['quarantined']} {_cell(json.dumps(r['quarantined_by_reason']))} |")
    out += ["", f"Accounting of the latest run adds up: **{report['adds_up']}** "
            f"({report['lines']} pool items). Runs in this dataset: "
            + ", ".join(f"`{r}`" for r in manifest["runs"]) + ".", "",
            "Split names are the family name with every character outside `[0-9A-Za-z_]` "
            "replaced by `_`: " + ", ".join(f"`{s}` ← {_cell(f)}"
                                            for s, f in sorted(split_families.items())),
            "", "## Examples", ""]
    for split, rows in sorted(examples.items()):
        out += [f"### {split}", ""]
        for qa, image_path in rows:
            out.append(f"![{qa['id']}]({image_path})")
            out += ["", "| field | value |", "|---|---|"]
            for key in ("id", "question", "answer", "org_answer", "wrong_vlm", "reason",
                        "promoted_by"):
                if qa.get(key) is not None:
                    out.append(f"| `{key}` | {_cell(qa[key])} |")
            out.append("")
    return "\n".join(out) + "\n"
