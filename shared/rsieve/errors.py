"""The rsieve error tree. Adapters translate vendor errors into it.

RsieveError
 ├── RetryableError      a transient failure of infrastructure (S3 503, Triton down):
 │                       retry the task; never recorded as a verdict
 ├── PermanentError      retrying cannot help (bad configuration, unknown run)
 │    ├── NotFoundError  an object or run that does not exist
 │    └── ConflictError  a request that contradicts what is stored (a dataset's sampling)
 └── CorruptOutputError  a stored stage output is corrupt (rsieve.envelope): already moved
                         aside and its stage sent again; the task that read it ends
"""

__all__ = [
    "ConflictError",
    "CorruptOutputError",
    "NotFoundError",
    "PermanentError",
    "RetryableError",
    "RsieveError",
]


class RsieveError(Exception):
    """Base of every error rsieve raises on purpose."""


class RetryableError(RsieveError):
    """Transient infrastructure failure: the task is retried."""


class PermanentError(RsieveError):
    """Retrying cannot help."""


class NotFoundError(PermanentError, FileNotFoundError):
    """An object, pool or run that does not exist."""


class ConflictError(PermanentError):
    """What was asked contradicts what is stored (a run into a dataset made otherwise)."""


class CorruptOutputError(RsieveError):
    """A stored stage output that is not what its writer stored (rsieve.envelope). Raised
    once the object is moved aside and the writer's stage is sent again for its shard
    (services/outputs.py, redo): the task that read it ends, not fails; the redo
    sends the stages after it again."""

    def __init__(self, key: str, reason: str, detail: str) -> None:
        super().__init__(f"{key}: {reason}: {detail}")
        self.key, self.reason, self.detail = key, reason, detail
