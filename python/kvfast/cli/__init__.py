"""The ``kvfast`` command: its commands (:mod:`.commands`, whose :func:`main` is the console
script's ``kvfast.cli:main``), shared argument types (:mod:`.args`), the views of one state
(:mod:`.views`) and ``kvfast write`` (:mod:`.write`)."""

from kvfast.cli.commands import main

__all__ = ["main"]
