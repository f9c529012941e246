"""What a model folder may publish: no local path of the machine that wrote it.

A model folder travels (``--push``, a copy, a Hub repo), so nothing in it may name where things lay on the
machine that exported it (a home folder, a user name, a temporary folder). The values enter through the config
(``output_dir``, ``data.path``, ``data.vae``, ``repa.encoder``, ... : any string field) and the metrics rows;
`public_config` and `public_rows` replace each local path by its last part (``/home/me/runs`` -> ``runs``,
``/tmp/x/tiny-vae`` -> ``tiny-vae``), which still names the thing without saying where it was. Relative paths
that stay below the current folder (``data/mnist32``) are kept: they say nothing about the machine.
`publish_json_files` does the same for the JSON files of a written folder (diffusers' configs record where a
component was loaded from), and `local_paths_in` checks a written folder for the paths it must not hold (the
export's last check).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vit5_sit.config import ExperimentConfig

_WINDOWS_ABSOLUTE = re.compile(r"^(?:[A-Za-z]:[\\/]|\\\\)")
_WORD = re.compile(r"[^\s=,;\"'`()\[\]]+")  # a word of a longer string, as a path in a command line is one
TEXT_SUFFIXES = (".json", ".yaml", ".yml", ".md", ".py", ".txt")  # the files of a folder `local_paths_in` reads


def is_local_path(text: str) -> bool:
    """Whether a string names a place on this machine: an absolute path (POSIX or Windows), one under ``~``, or a
    relative one that climbs out of the current folder (``..``)."""
    if text.startswith(("/", "~")) or _WINDOWS_ABSOLUTE.match(text):
        return True
    return ".." in re.split(r"[\\/]", text)


def _last_part(text: str) -> str:
    path = PureWindowsPath(text) if "\\" in text else PurePosixPath(text)
    return path.name or ""


def public_text(text: str) -> str:
    """The string with each local path in it (`is_local_path`: the whole string, or a word of it, as in a command
    line ``eval_fid.py compare --reference /home/me/ref.npz``) replaced by its last part."""
    if is_local_path(text):
        return _last_part(text)
    return _WORD.sub(lambda m: _last_part(m.group()) if len(m.group()) > 1 and is_local_path(m.group())
                     else m.group(), text)


def _public(value):
    if isinstance(value, str):
        return public_text(value)
    if isinstance(value, list | tuple):
        return type(value)(_public(v) for v in value)
    if isinstance(value, dict):
        return {k: _public(v) for k, v in value.items()}
    return value


def public_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config with every local path among its string values (any section, model overrides included)
    replaced by its last part: what a model folder's config.yaml and card may say."""

    def walk(obj):
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return dataclasses.replace(obj, **{f.name: walk(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                               if f.init})
        return _public(obj)

    return walk(cfg)


def public_rows(rows) -> list[dict]:
    """Metrics rows with every local path among their values replaced by its last part."""
    return [_public(dict(row)) for row in rows]


def publish_json_files(folder: str | Path) -> None:
    """Every JSON file in ``folder`` (diffusers' configs: a VAE saved by diffusers records where it was loaded
    from as ``_name_or_path``) with each local path among its string values replaced by its last part."""
    import json

    from vit5_sit.common.utils import atomic_write_text

    for path in sorted(Path(folder).rglob("*.json")):
        data = json.loads(path.read_bytes())
        public = _public(data)
        if public != data:
            atomic_write_text(path, json.dumps(public, indent=2, sort_keys=True) + "\n")


def local_paths_in(folder: str | Path, paths: list[str]) -> list[tuple[str, str]]:
    """(file, path) for each of ``paths`` (absolute paths of this machine) that a file of ``folder`` holds: its text
    files (`TEXT_SUFFIXES`) and the metadata of its safetensors files."""
    from safetensors import safe_open

    folder = Path(folder)
    wanted = [p for p in dict.fromkeys(paths) if p and p not in ("/", "\\")]
    found = []
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        if file.suffix in TEXT_SUFFIXES:
            text = file.read_text(encoding="utf-8", errors="replace")
        elif file.suffix == ".safetensors":
            with safe_open(str(file), "pt") as f:
                text = repr(f.metadata() or {})
        else:
            continue
        found += [(str(file.relative_to(folder)), p) for p in wanted if p in text]
    return found
