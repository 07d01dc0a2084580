"""What every command of the command line stands on: where the local stack is, the
settings and the context it reaches the stack with (services.runs.connect: the run logic
it drives as the services do), the API call, and one-line errors (`error: <what>; fix:
<how>`, exit 1, never a traceback)."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console

from rsieve import keys
from rsieve.errors import CorruptOutputError, NotFoundError, RetryableError, RsieveError

if TYPE_CHECKING:  # imported where used: the command line starts without them
    from rsieve.settings import Settings
    from rsieve_cli.local.stack import Stack
    from services.runs import StageContext

console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])
STACK_FIX = "start it with `rsieve stack up` (or point RSIEVE_API_URL / RSIEVE_S3_ENDPOINT at it)"


def local_stack() -> Stack:
    from rsieve_cli.local.stack import Stack, StackConfig

    state = Path(os.environ.get("RSIEVE_STACK_DIR", "var/stack")).resolve()
    saved = state / "config.json"
    if saved.is_file():  # reuse the ports and models the stack was started with
        return Stack(StackConfig.load(saved))
    return Stack(StackConfig(state_dir=state))


def settings() -> Settings:
    """Settings for the local stack when one was started here, else from RSIEVE_* env."""
    from rsieve.settings import Settings

    state = Path(os.environ.get("RSIEVE_STACK_DIR", "var/stack")).resolve()
    if (state / "config.json").is_file():
        return Settings.from_env_map(local_stack().config.env())
    return Settings()


def context() -> StageContext:
    """The bucket, Redis and queues the services use, for the commands that drive a run's
    logic through services.runs (reconcile, reading its sealed outputs)."""
    from services.runs import connect

    return connect(settings())


class Failure(Exception):
    """A failure the user can fix: printed as `error: <what>; fix: <how>`, exit 1."""

    def __init__(self, what: str, fix: str | None = None) -> None:
        super().__init__(what if fix is None else f"{what}; fix: {fix}")


def friendly(fn: F) -> F:
    """Turn every expected failure of a command into one line on stderr and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import httpx

        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except Failure as exc:
            message = str(exc)
        except httpx.TransportError as exc:
            message = f"cannot reach the API ({type(exc).__name__}: {exc}); fix: {STACK_FIX}"
        except RetryableError as exc:
            message = f"storage or queue unreachable ({exc}); fix: {STACK_FIX}"
        except CorruptOutputError as exc:
            message = (
                f"a stored output was corrupt ({exc}): it was moved aside and its stage is "
                "being redone; fix: run this again once `rsieve status` shows the run done"
            )
        except (RsieveError, OSError, TimeoutError) as exc:
            message = str(exc) or type(exc).__name__
        except Exception as exc:
            if type(exc).__module__.split(".")[0] in ("redis", "botocore", "kombu"):
                message = f"{type(exc).__name__}: {exc}; fix: {STACK_FIX}"
            else:
                raise
        console.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)

    return wrapper  # type: ignore[return-value]


def api(method: str, path: str, **kwargs: Any) -> Any:
    """Call the API with the configured token; HTTP errors become Failures with a fix."""
    from rsieve_cli.client import api_request

    s = settings()
    resp = api_request(s, method, path, **kwargs)
    if resp.status_code == 401:
        raise Failure(
            f"the API at {s.api_url} refused the token", "set RSIEVE_API_TOKEN to the API's token"
        )
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail")
        except ValueError:
            detail = resp.text[:300]
        fix = {
            404: "`rsieve status` lists the runs",
            409: "wait until `rsieve status RUN` says done",
        }.get(resp.status_code)
        raise Failure(f"{detail if isinstance(detail, str) else json.dumps(detail)}", fix)
    return resp.json()


def spec_or_fail(ctx: StageContext, run_id: str) -> Any:
    """RUN's spec, or a Failure naming where it was looked for."""
    from services import runs

    try:
        return runs.spec(ctx, run_id)
    except NotFoundError:
        raise Failure(
            f"no run {run_id!r} in s3://{ctx.settings.s3_bucket}/{keys.RUNS_PREFIX}",
            "`rsieve status` lists the runs",
        ) from None


def published(ctx: StageContext, run_id: str) -> Any:
    """RUN's spec once the run is committed to its dataset, else a Failure."""
    from rsieve.adapters.committed import run_manifest

    spec = spec_or_fail(ctx, run_id)
    if run_manifest(ctx.store, spec.dataset, run_id) is None:
        raise Failure(
            f"run {run_id} is not committed to dataset {spec.dataset} yet",
            f"wait until `rsieve status {run_id}` says done",
        )
    return spec
