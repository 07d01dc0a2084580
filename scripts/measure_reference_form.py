"""The reference-form purity rule (rsieve.clean.purity, `reference_form_off`) over a real
labelled pool: per family, its protocol, its attribute share, whether it reads the text,
how many of its own items the rule would drop (false positives, on a pool of genuine
items), and how many of four questions about the text added to it the rule catches.

    .venv/bin/python -m scripts.measure_reference_form FOLDER

FOLDER holds items.jsonl (only read; no image is opened).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from rsieve.clean.purity import PurityQuestion, first_reference, measure_purity
from rsieve.families import protocol_for

# Questions about the text that read nothing, each with an answer it could have.
ABOUT_THE_TEXT = (
    ("Is the text handwritten or printed?", "printed"),
    ("What is the colour of the ink?", "black"),
    ("How many words are written?", "1"),
    ("Which font is it, serif or sans-serif?", "serif"),
)
ADDED = 1_000_000  # line numbers of the added questions, past any pool's


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    families: dict[str, list[PurityQuestion]] = defaultdict(list)
    with (args.folder / "items.jsonl").open() as lines:
        for n, line in enumerate(lines, 1):
            item = json.loads(line)
            families[item["family"]].append(
                PurityQuestion(
                    n,
                    item["question"],
                    has_options=bool(item.get("options")),
                    reference=first_reference(item["answer"]),
                )
            )
    print("family | protocol | items | attribute share | reads text | own dropped | added caught")
    for family, questions in sorted(families.items()):
        protocol = str(protocol_for(family))
        alone = measure_purity(
            family, protocol, questions, threshold=0.05, min_items=20, embed=None
        )
        added = [
            PurityQuestion(ADDED + k, q, reference=a) for k, (q, a) in enumerate(ABOUT_THE_TEXT)
        ]
        both = measure_purity(
            family, protocol, [*questions, *added], threshold=0.05, min_items=20, embed=None
        )
        caught = sum(both.rule_of_line[q.line] == "reference_form_off" for q in added)
        print(
            f"{family} | {protocol} | {len(questions)} | {alone.attribute_share} | "
            f"{alone.reads_text} | {alone.by_rule.get('reference_form_off', 0)} | "
            f"{caught} of {len(added)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
