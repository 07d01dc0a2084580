"""`python -m services.judge`: a worker on the judge queue (a GPU service)."""

from services.common import run_worker
from services.judge.tasks import register

if __name__ == "__main__":
    run_worker("judge", "judge", register)
