"""The rsieve error tree. Adapters translate vendor errors into it.

RsieveError
 ├── RetryableError      a transient failure of infrastructure (S3 503, Triton down):
 │                       retry the task; never recorded as a verdict
 └── PermanentError      retrying cannot help (bad configuration, unknown run)
      ├── NotFoundError  an object or run that does not exist
      └── ConflictError  a request that contradicts what is stored (a dataset's sampling)
"""

__all__ = ["ConflictError", "NotFoundError", "PermanentError", "RetryableError", "RsieveError"]


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
