"""`python -m services.judge`: a worker on the judge queue (a GPU service)."""

from services.judge.tasks import register
from services.worker import run_worker

if __name__ == "__main__":
    run_worker("judge", "judge", register)
