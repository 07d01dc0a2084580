"""`python -m services.compactor`: a worker on the compact queue."""

from services.compactor.tasks import register
from services.worker import run_worker

if __name__ == "__main__":
    run_worker("compactor", "compact", register)
