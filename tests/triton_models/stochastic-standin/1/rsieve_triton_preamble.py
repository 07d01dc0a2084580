"""The start-up preamble of every rsieve Triton Python-backend ``model.py``.

Importing this module puts the site-packages named in ``RSIEVE_TRITON_SITE_PACKAGES`` first
on ``sys.path`` (with ``site.addsitedir``, so their ``.pth`` files run too). A model imports
it before its third-party imports (numpy<2, Pillow, RapidOCR, torch, ...):

    import rsieve_triton_preamble  # noqa: F401  (first: puts the venv on sys.path)

Why: the Triton Python-backend stub embeds the system libpython in isolated mode (it
ignores ``PYTHONPATH``), so ``rsieve_cli.local.triton_server.start_triton`` names the venv's
site-packages in this variable instead. Unset (a production Triton image): a no-op. Only
the standard library is imported here: nothing else is importable yet (nor is ``rsieve``,
which lives in those site-packages locally and is absent from the Triton images).

How a model finds this file: before it imports ``1.model`` the stub appends the model's
version folder (``<model>/1``) and the model folder to ``sys.path``. Each model's version
folder holds ``rsieve_triton_preamble.py`` as a relative symlink to this one file
(``deploy/triton/rsieve_triton_preamble.py``), so it is found wherever the model is served:
in place (the local stack serves ``deploy/triton/cpu``), copied with ``shutil.copytree``
(the test and benchmark stacks; the copy follows the link) or in the ``triton-cpu`` image,
whose Dockerfile puts the file itself in place of each link (``COPY`` keeps a link, which
would dangle there), as it does for ``judge-smollm2/1/model.py``.
"""

from __future__ import annotations

import os
import site
import sys

SITE_PACKAGES_ENV = "RSIEVE_TRITON_SITE_PACKAGES"


def add_site_packages() -> None:
    """Put the site-packages named in ``RSIEVE_TRITON_SITE_PACKAGES`` first on ``sys.path``.

    In the variable's order, each one not already there; unset or empty: a no-op."""
    paths = os.environ.get(SITE_PACKAGES_ENV, "").split(os.pathsep)
    for path in reversed([p for p in paths if p]):
        if path not in sys.path:
            sys.path.insert(0, path)
            site.addsitedir(path)  # also runs the .pth files there


add_site_packages()
