"""The dataset card (README.md): YAML configs for every split, then how the data was
produced, the rules with their constants, the cleaning, the counts and examples."""

from __future__ import annotations

import json
from typing import Any

import yaml

from rsieve.judge import TEMPLATE_SHA256
from rsieve.schemas import QUARANTINE_REASONS, REJECT_REASONS
from rsieve.verify import PROTOCOLS

__all__ = ["render_card"]


def render_card(*, dataset: str, spec: dict[str, Any], report: dict[str, Any],
                split_files: dict[str, list[str]], split_rows: dict[str, int],
                split_families: dict[str, str], examples: dict[str, list[dict[str, Any]]]
                ) -> str:
    front = {
        "configs": [{
            "config_name": "default",
            "data_files": [{"split": s, "path": files} for s, files in split_files.items()],
        }],
        "tags": ["rejection-sampling", "vision-language", "sft"],
    }
    out = ["---", yaml.safe_dump(front, sort_keys=False, allow_unicode=True).strip(), "---", "",
           f"# {dataset}", "",
           "Rejection-sampled supervised fine-tuning data for vision-language models, made "
           "by rsieve.", "",
           "## How the data was produced", "",
           f"Model `{spec['settings']['generator_model']}` answered every question at "
           f"temperature {spec['settings']['temperature']} with reasoning requested. The "
           "`question` field is byte-identical to the prompt the model received, appended "
           "instruction included. Each answer (the text after the reasoning) was compared with "
           "the reference by the family's protocol, tried whole, as its first line and as its "
           "first paragraph. Matches go to `<Family>_RS_think` and `<Family>_RS_nothink`; every "
           "rejection went to a text-only judge "
           f"(`{spec['settings']['judge_model']}`, prompt template sha256 `{TEMPLATE_SHA256[:16]}`)"
           " that sees question, reference and candidate and answers CORRECT, WRONG or UNSURE. "
           "Only CORRECT promotes; WRONG and UNSURE stay in `<Family>_rejected`, where `answer` "
           "is the reference and `wrong_vlm` what the model said.", "",
           "In accepted splits `answer` is the model's own verified output and `org_answer` the "
           "reference; the think split carries the reasoning.", "",
           "## Verification protocols", "",
           "| protocol | version | accept at score | constants |", "|---|---|---|---|"]
    used = sorted({p for p in spec.get("protocols_used", [])} or PROTOCOLS)
    for name in used:
        p = PROTOCOLS[name]
        out.append(f"| `{name}` | {p.version} | >= {p.threshold} | "
                   f"`{json.dumps(p.constants, ensure_ascii=False)}` |")
    out += ["", "## Counts", "", "| split | family | rows (images) |", "|---|---|---|"]
    out += [f"| `{s}` | {split_families[s]} | {n} |" for s, n in split_rows.items()]
    out += ["", "| family | items in | accepted (judge) | rejected | quarantined |",
            "|---|---|---|---|---|"]
    for fam, r in report["families"].items():
        out.append(f"| {fam} | {r['in']} | {r['accepted']} ({r['promoted_by_judge']}) | "
                   f"{r['rejected']} {json.dumps(r['rejected_by_reason'])} | "
                   f"{r['quarantined']} {json.dumps(r['quarantined_by_reason'])} |")
    out += ["", "Split names are the family name with every character outside `[0-9A-Za-z_]` "
            "replaced by `_`: " + ", ".join(f"`{s}` ← {f}" for s, f in split_families.items()),
            "", "## Cleaning applied", "",
            "Items are quarantined (listed in `quarantine.jsonl` with id, pool line, family, "
            "stage and reason) and never reach a split when:", ""]
    out += [f"- `{k}`: {v}" for k, v in QUARANTINE_REASONS.items()]
    out += ["", f"Provenance policy: `{spec['settings']['provenance_policy']}`. Rejected-split "
            "reasons:", ""]
    out += [f"- `{k}`: {v}" for k, v in REJECT_REASONS.items()]
    out += ["", "## Examples", ""]
    for split, rows in examples.items():
        out.append(f"### {split}")
        out.append("")
        for qa in rows:
            shown = {k: v for k, v in qa.items()
                     if k in ("id", "question", "answer", "org_answer", "wrong_vlm", "reason")
                     and v is not None}
            out.append("```json\n" + json.dumps(shown, ensure_ascii=False, indent=1) + "\n```")
        out.append("")
    out += [f"Run `{report['run']}`: {report['lines']} pool items, accounting adds up: "
            f"{report['adds_up']}.", ""]
    return "\n".join(out)
