"""`python -m services.cleaner`: a worker on the clean queue."""

from services.cleaner.tasks import register
from services.worker import run_worker

if __name__ == "__main__":
    run_worker("cleaner", "clean", register)
