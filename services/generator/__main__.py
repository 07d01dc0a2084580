"""`python -m services.generator`: a worker on the generate queue (a GPU service)."""

from services.generator.tasks import register
from services.worker import run_worker

if __name__ == "__main__":
    # Threads, one open shard each, all feeding one engine gate (services/generator/feeder.py).
    run_worker("generator", "generate", register, lambda s: s.generator_concurrency, pool="threads")
