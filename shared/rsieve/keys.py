"""Every object-storage key of rsieve, built here and nowhere else. A key is stored data: one
changed by accident orphans everything written under the old one, so each is built by one
function below, and tests/unit/test_keys.py pins the string each returns. Pure (strings in,
strings out; no I/O).

The bucket (`<run>` a run id, `<shard>` a shard label (rsieve.run.shards), `<dataset>` a dataset
name; a trailing `/` is a prefix):

    pools/<pool_sha256>/                    an uploaded pool folder (pool_prefix)
        items.jsonl, _refused.json, ...     its files as uploaded (rsieve.run.submission);
                                            `_complete` written last (rsieve.watch)
        _packs/...                          its images in packs, and their index (rsieve.run.packs)
    images/<sha256>                         an image the generator re-encoded, by content
    evalsets/<name>.json                    a registered evaluation set (rsieve.clean.decontam)
    judge-cache/<sha256>.json               a judge reply, by what decided it
                                            (rsieve.judge.judgecache)
    index/runs/<run>.json                   a submitted run, written at submission (runs list
                                            from here, cheaply)
    runs/<run>/
        run.json                            the run's spec, written once at submission
        shards.json                         its shards and their lines (ingest's commit point)
        cleaning.json                       whole-pool cleaning measurements (purity, duplicates)
        failed.json                         why the run stopped (rsieve.run.failures), until
                                            `rsieve reconcile` resumes it
        input/<shard>.json                  a shard's lines as ingest placed them
        <stage>/<shard>.json                a stage's output for a shard (rsieve.schemas.STAGES)
        calibration/<shard>.json            the judge's calibration probes for a shard
        corrupt/<stage>/<shard>.<sha16>.bad a stored output found corrupt, kept for inspection
        corrupt/<stage>/<shard>.<sha16>.json   why (rsieve.envelope); the stage was redone
        reviews/<sha256(item id)>.json      a person's review of a judge promotion
        ingest/                             a pool ingested in rounds (services/cleaner/ingest.py)
            plan.json                       its ranges and partitions
            <kind>/<to>/<from>.json         records a task hands a task of a later round
            done/<round>/<part>.json        a task's summary, written last
        compact/                            compaction (services/compactor/steps.py)
            plan.json                       its partitions and routing groups
            calibration.json                the run's calibration summary and token usage
            route/<partition>/<group>.json  a routing group's outcomes for one partition
            route/calibration/<group>.json  a routing group's mark (its bottom-k), written last
            g<gen>/<partition>.json         a partition's summary against dataset generation gen
            g<gen>/<partition>.quarantine.jsonl   its quarantine
    datasets/<dataset>/                     a published dataset; below, relative to it:
        manifest.json                       written last by each commit (its commit point)
        data/<split>-<run>[-<partition>]-<i>-of-<n>.parquet   a run's rows
        keys/qa/<bucket>-<run>.bin          a bucket of the key index as of a commit
                                            (rsieve.compact.keyindex)
        keys/<run>.json                     a run's key list from before the key index
        keys/<run>[-<partition>].near.json  a committed run's near keys (ingest's screen)
        examples/<sha256[:16]>.<ext>        an image the card shows
        commits/<run>/<name>                a commit's card, report, quarantine and run spec
        <name>                              browsing copies of the current commit's files
"""

from __future__ import annotations

import hashlib

__all__ = [
    "DATASETS_PREFIX",
    "EVALSETS_PREFIX",
    "IMAGES_PREFIX",
    "INDEX_PREFIX",
    "JUDGE_CACHE_PREFIX",
    "MANIFEST",
    "NEAR_KEYS_SUFFIX",
    "POOLS_PREFIX",
    "RUNS_PREFIX",
    "RUN_INDEX_PREFIX",
    "calibration",
    "calibration_prefix",
    "cleaning",
    "commit_file",
    "compact_calibration",
    "compact_generation_prefix",
    "compact_piece",
    "compact_plan",
    "compact_prefix",
    "compact_quarantine",
    "compact_routed",
    "compact_routed_prefix",
    "compact_summary",
    "corrupt_copy",
    "corrupt_prefix",
    "corrupt_record",
    "data_shard",
    "dataset_file",
    "dataset_keys_prefix",
    "dataset_of_manifest",
    "dataset_prefix",
    "evalset",
    "evalset_name",
    "example_image",
    "image",
    "ingest_done",
    "ingest_done_prefix",
    "ingest_part",
    "ingest_part_prefix",
    "ingest_plan",
    "judge_reply",
    "legacy_run_keys",
    "manifest",
    "near_keys",
    "near_keys_run",
    "pool_prefix",
    "qa_key_bucket",
    "review",
    "reviews_prefix",
    "run_index",
    "run_prefix",
    "run_spec",
    "shard_input",
    "shards",
    "stage_output",
    "stage_prefix",
]

# --- top level ----------------------------------------------------------------------------

POOLS_PREFIX = "pools/"
IMAGES_PREFIX = "images/"
EVALSETS_PREFIX = "evalsets/"
JUDGE_CACHE_PREFIX = "judge-cache/"
INDEX_PREFIX = "index/"
RUN_INDEX_PREFIX = f"{INDEX_PREFIX}runs/"
RUNS_PREFIX = "runs/"
DATASETS_PREFIX = "datasets/"


def pool_prefix(pool_sha256: str) -> str:
    """An uploaded pool's folder, by the pool's digest (rsieve.run.submission.pool_digest)."""
    return f"{POOLS_PREFIX}{pool_sha256}/"


def image(sha256: str) -> str:
    """An image the generator re-encoded, by the sha256 of its bytes."""
    return f"{IMAGES_PREFIX}{sha256}"


def evalset(name: str) -> str:
    """A registered evaluation set."""
    return f"{EVALSETS_PREFIX}{name}.json"


def evalset_name(key: str) -> str | None:
    """The evaluation set an `evalset` key names; None for any other key."""
    if key.startswith(EVALSETS_PREFIX) and key.endswith(".json"):
        return key[len(EVALSETS_PREFIX) : -len(".json")]
    return None


def judge_reply(digest: str) -> str:
    """A cached judge reply, by the sha256 of what decided it (rsieve.judge.judgecache)."""
    return f"{JUDGE_CACHE_PREFIX}{digest}.json"


def run_index(run: str) -> str:
    """A submitted run's entry in the run index."""
    return f"{RUN_INDEX_PREFIX}{run}.json"


# --- runs/<run>/ --------------------------------------------------------------------------


def run_prefix(run: str) -> str:
    return f"{RUNS_PREFIX}{run}/"


def run_spec(run: str) -> str:
    """The run's spec (rsieve.schemas.RunSpec), written once at submission."""
    return f"{run_prefix(run)}run.json"


def shards(run: str) -> str:
    """The run's shard index, written last by ingest (its commit point)."""
    return f"{run_prefix(run)}shards.json"


def run_failed(run: str) -> str:
    """Why the run stopped (rsieve.run.failures.RunFailure); deleted when it is resumed."""
    return f"{run_prefix(run)}failed.json"


def cleaning(run: str) -> str:
    """The run's whole-pool cleaning measurements (rsieve.clean.cleaning.cleaning_report)."""
    return f"{run_prefix(run)}cleaning.json"


def shard_input(run: str, shard: str) -> str:
    """A shard's lines as ingest placed them (rsieve.run.shards.ShardInput)."""
    return f"{run_prefix(run)}input/{shard}.json"


def stage_prefix(run: str, stage: str) -> str:
    return f"{run_prefix(run)}{stage}/"


def stage_output(run: str, stage: str, shard: str) -> str:
    """What one stage wrote for one shard (rsieve.schemas.ShardOutput)."""
    return f"{stage_prefix(run, stage)}{shard}.json"


def progress(run: str, stage: str, shard: str) -> str:
    """A shard's replies so far, stored as they come and read by its redelivery
    (rsieve.generate.progress.ShardProgress); deleted once its stage output is stored."""
    return f"{run_prefix(run)}progress/{stage}/{shard}.json"


def calibration_prefix(run: str) -> str:
    return f"{run_prefix(run)}calibration/"


def calibration(run: str, shard: str) -> str:
    """The judge's calibration probes for one shard (rsieve.judge.calibration.CalibrationShard)."""
    return f"{calibration_prefix(run)}{shard}.json"


def corrupt_prefix(run: str) -> str:
    return f"{run_prefix(run)}corrupt/"


def corrupt_copy(run: str, stage: str, shard: str, digest: str) -> str:
    """A stored output of `stage` found corrupt (rsieve.envelope), moved aside as it was;
    `digest` the first 16 hex digits of its bytes' sha256."""
    return f"{corrupt_prefix(run)}{stage}/{shard}.{digest[:16]}.bad"


def corrupt_record(run: str, stage: str, shard: str, digest: str) -> str:
    """Why that object was found corrupt, who read it, and what was done again."""
    return f"{corrupt_prefix(run)}{stage}/{shard}.{digest[:16]}.json"


def reviews_prefix(run: str) -> str:
    return f"{run_prefix(run)}reviews/"


def review(run: str, item_id: str) -> str:
    """A person's review of a judge promotion, by the sha256 of the item's id (any id is
    a safe key)."""
    return f"{reviews_prefix(run)}{hashlib.sha256(item_id.encode()).hexdigest()}.json"


# runs/<run>/ingest/: a pool ingested in rounds (services/cleaner/ingest.py)


def ingest_plan(run: str) -> str:
    return f"{run_prefix(run)}ingest/plan.json"


def ingest_done_prefix(run: str, round_: str) -> str:
    return f"{run_prefix(run)}ingest/done/{round_}/"


def ingest_done(run: str, round_: str, part: int) -> str:
    """The summary a round's task for `part` writes last."""
    return f"{ingest_done_prefix(run, round_)}{part:05d}.json"


def ingest_part_prefix(run: str, kind: str, dest: int) -> str:
    """The records of `kind` handed to the task of range or partition `dest`."""
    return f"{run_prefix(run)}ingest/{kind}/{dest:05d}/"


def ingest_part(run: str, kind: str, dest: int, src: str) -> str:
    """The records of `kind` task `src` hands the task of range or partition `dest`."""
    return f"{ingest_part_prefix(run, kind, dest)}{src}.json"


# runs/<run>/compact/: compaction (services/compactor/steps.py); `partition` is a label
# (rsieve.run.partitions.partition_label)


def compact_prefix(run: str) -> str:
    return f"{run_prefix(run)}compact/"


def compact_plan(run: str) -> str:
    return f"{compact_prefix(run)}plan.json"


def compact_calibration(run: str) -> str:
    return f"{compact_prefix(run)}calibration.json"


def compact_piece(run: str, partition: str, group: int) -> str:
    """A routing group's outcomes and quarantines for one partition."""
    return f"{compact_prefix(run)}route/{partition}/{group:05d}.json"


def compact_routed_prefix(run: str) -> str:
    return f"{compact_prefix(run)}route/calibration/"


def compact_routed(run: str, group: int) -> str:
    """A routing group's mark (its calibration bottom-k and tokens), written last."""
    return f"{compact_routed_prefix(run)}{group:05d}.json"


def compact_generation_prefix(run: str, gen: int) -> str:
    """The partitions' summaries against the dataset's generation `gen` (its runs)."""
    return f"{compact_prefix(run)}g{gen}/"


def compact_summary(run: str, gen: int, partition: str) -> str:
    return f"{compact_generation_prefix(run, gen)}{partition}.json"


def compact_quarantine(run: str, gen: int, partition: str) -> str:
    return f"{compact_generation_prefix(run, gen)}{partition}.quarantine.jsonl"


# --- datasets/<dataset>/ ------------------------------------------------------------------

MANIFEST = "manifest.json"  # relative to the dataset's prefix, as every path below
NEAR_KEYS_SUFFIX = ".near.json"


def dataset_prefix(dataset: str) -> str:
    return f"{DATASETS_PREFIX}{dataset}/"


def dataset_file(dataset: str, path: str) -> str:
    """The key of `path`, relative to the dataset's prefix (a manifest's `files` value,
    a shard's `path`, one of the functions below)."""
    return dataset_prefix(dataset) + path


def manifest(dataset: str) -> str:
    """The dataset's manifest, written last by each commit (its commit point)."""
    return dataset_file(dataset, MANIFEST)


def dataset_of_manifest(key: str) -> str | None:
    """The dataset whose manifest `key` is; None for any other key."""
    parts = key.split("/")
    if len(parts) == 3 and f"{parts[0]}/" == DATASETS_PREFIX and parts[2] == MANIFEST:
        return parts[1]
    return None


def dataset_keys_prefix(dataset: str) -> str:
    return dataset_file(dataset, "keys/")


def near_keys(dataset: str, run: str) -> str:
    """A committed run's (image hash, question key, answer key) triples (rsieve.commit.
    near_keys), which ingest screens a new pool against; `run` is `<run>-<partition>`
    for each partition of a run compacted in several."""
    return f"{dataset_keys_prefix(dataset)}{run}{NEAR_KEYS_SUFFIX}"


def near_keys_run(dataset: str, key: str) -> str | None:
    """The run (or `<run>-<partition>`) a `near_keys` key of `dataset` names; None for any
    other key."""
    prefix = dataset_keys_prefix(dataset)
    if key.startswith(prefix) and key.endswith(NEAR_KEYS_SUFFIX):
        return key[len(prefix) : -len(NEAR_KEYS_SUFFIX)]
    return None


# Relative to the dataset's prefix (dataset_file makes them keys):


def data_shard(split: str, run: str, index: int, count: int, partition: str | None = None) -> str:
    """`data/<split>-<run>[-<partition>]-<i>-of-<n>.parquet`: a run's shards never collide
    with another run's (nor a partition's with another's), and the same run always writes
    the same names (redelivery rewrites, not adds)."""
    part = f"-{partition}" if partition else ""
    return f"data/{split}-{run}{part}-{index:05d}-of-{count:05d}.parquet"


def qa_key_bucket(bucket: str, run: str) -> str:
    """A bucket's file of the key index as of `run`'s commit (rsieve.compact.keyindex)."""
    return f"keys/qa/{bucket}-{run}.bin"


def legacy_run_keys(run: str) -> str:
    """A run's JSON key list, from before the key index (manifest `legacy_key_runs`)."""
    return f"keys/{run}.json"


def example_image(sha256: str, ext: str) -> str:
    """An image the card shows, by its sha256's first 16 hex digits."""
    return f"examples/{sha256[:16]}.{ext}"


def commit_file(run: str, name: str) -> str:
    """A commit's README.md, run_report.json, quarantine.jsonl or run_spec.json (a dataset
    of one run from before commits/ has them at its top only:
    rsieve.adapters.committed.run_file_key)."""
    return f"commits/{run}/{name}"
