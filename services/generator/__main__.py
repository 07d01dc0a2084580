"""`python -m services.generator`: a worker on the generate queue (a GPU service)."""

from services.common import run_worker
from services.generator.tasks import register

if __name__ == "__main__":
    # Its own child count: the children overlap consecutive shards and share one
    # max_inflight (services/generator/inflight.py).
    run_worker("generator", "generate", register, lambda s: s.generator_concurrency)
