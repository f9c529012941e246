"""vit5-sit: SiT interpolant flow matching with a ViT-5 backbone (training, sampling, evaluation, the Hub)."""

from __future__ import annotations

from vit5_sit.common.interrupt import started_as_command, stop_while_starting

if started_as_command():  # before the command's imports (torch: seconds): SIGTERM then is one line, exit 130
    stop_while_starting()

PYPROJECT_VERSION = "0.1.0"  # fallback when the package is not installed (keep equal to pyproject.toml's version)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vit5-sit")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return PYPROJECT_VERSION


__version__ = _version()


def __getattr__(name: str):
    """``from vit5_sit import Vit5SitPipeline``: imported on first use (torch and the models load then), so that
    ``import vit5_sit`` (every command's ``--help``) stays fast."""
    if name in ("Vit5SitPipeline", "Vit5SitPipelineOutput"):
        from vit5_sit import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'vit5_sit' has no attribute {name!r}")
