"""`python -m services.compactor`: a worker on the compact queue."""

from services.common import run_worker
from services.compactor.tasks import register

if __name__ == "__main__":
    run_worker("compactor", "compact", register)
