"""Compactor: assembles every judged shard of a run into the dataset's splits (Parquet),
its card, run_report.json and quarantine.jsonl under datasets/<dataset>/, manifest last."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from rsieve.card import render_card
from rsieve.report import run_report
from rsieve.rows import FEATURES, assemble_rows
from services.common import Context, StageTask


def register(ctx: Context) -> None:
    @ctx.app.task(name="rsieve.compact", base=StageTask)
    def compact(run: str) -> None:
        spec, store = ctx.spec(run), ctx.store
        prefix = f"datasets/{spec.dataset}/"
        manifest_key = prefix + "manifest.json"
        if store.exists(manifest_key) and json.loads(store.get(manifest_key))["run"] == run:
            return
        index = json.loads(store.get(f"runs/{run}/shards.json"))
        outcomes, quarantined = [], []
        for shard in index["shards"]:
            for stage in ("clean", "generate", "verify", "judge"):
                stage_output = ctx.load(run, stage, shard)
                quarantined += stage_output.quarantined
            outcomes += stage_output.outcomes
        report = run_report(run=run, lines=index["lines"], outcomes=outcomes,
                            quarantined=quarantined, blank_lines=index["blank_lines"])
        splits = assemble_rows(outcomes)
        family_of = {o.generation.item.id: o.generation.item.family for o in outcomes}
        files, rows_per_split, families, examples = {}, {}, {}, {}
        for split, rows in splits.items():
            for row in rows:
                row["image"] = {"bytes": store.get(f"images/{row['image_sha256']}"),
                                "path": row["image_sha256"]}
            name = f"data/{split}-00000-of-00001.parquet"
            buf = io.BytesIO()
            pq.write_table(pa.Table.from_pylist(rows, schema=FEATURES.arrow_schema), buf)
            store.put(prefix + name, buf.getvalue())
            files[split], rows_per_split[split] = [name], len(rows)
            families[split] = family_of[rows[0]["qa"][0]["id"]]
            examples[split] = [row["qa"][0] for row in rows[:3]]
        spec_dict = spec.model_dump()
        spec_dict["protocols_used"] = sorted({o.generation.item.protocol for o in outcomes})
        card = render_card(dataset=spec.dataset, spec=spec_dict, report=report,
                           split_files=files, split_rows=rows_per_split,
                           split_families=families, examples=examples)
        quarantine = "".join(json.dumps(q.model_dump(exclude={"detail"}) | {"detail": q.detail},
                                        ensure_ascii=False) + "\n"
                             for q in sorted(quarantined, key=lambda q: q.line))
        store.put(prefix + "README.md", card.encode(), content_type="text/markdown")
        store.put(prefix + "run_report.json", json.dumps(report, indent=1).encode())
        store.put(prefix + "quarantine.jsonl", quarantine.encode())
        manifest = {"run": run, "dataset": spec.dataset, "adds_up": report["adds_up"],
                    "files": ["README.md", "run_report.json", "quarantine.jsonl",
                              *[f for fs in files.values() for f in fs]],
                    "splits": rows_per_split}
        store.put(manifest_key, json.dumps(manifest, indent=1).encode())  # the commit point

