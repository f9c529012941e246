"""Errors a user can fix; the CLI prints their message and exits with code 2."""


class EvalError(Exception):
    """A mistake in the inputs (missing file, wrong array layout, unknown metric); the message says it."""


class InceptionWeightsError(EvalError):
    """No usable Inception weights; the message says where to put a file, which env var, what to install."""
