"""`python -m services.verifier`: a worker on the verify queue."""

from services.verifier.tasks import register
from services.worker import run_worker

if __name__ == "__main__":
    run_worker("verifier", "verify", register)
