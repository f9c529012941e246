"""Compatibility alias: this module is now `vit5_sit.model_files` (finding and loading models for sampling
and evaluation), renamed so that it is not confused with `vit5_sit.train.checkpoint` (training state).

Old imports (``from vit5_sit.checkpoint import load_for_sampling``) keep working; new code imports
`vit5_sit.model_files`. To monkeypatch a name, patch it there: this module only re-exports.
"""

from vit5_sit.model_files import (
    DEMO_MODEL,
    ModelLoadError,
    check_finite,
    load_for_sampling,
    local_model_path,
    model_identity,
    resolve_checkpoint,
)

__all__ = [
    "DEMO_MODEL",
    "ModelLoadError",
    "check_finite",
    "load_for_sampling",
    "local_model_path",
    "model_identity",
    "resolve_checkpoint",
]
