"""`python -m services.verifier`: a worker on the verify queue."""

from services.common import run_worker
from services.verifier.tasks import register

if __name__ == "__main__":
    run_worker("verifier", "verify", register)
