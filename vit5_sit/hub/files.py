"""Hub repo ids and model files in the Hugging Face cache: parse ``owner/name[@revision]``, download a model
repo's files once, or find the cached copy offline.

Kept apart from `vit5_sit.hub.api` (model cards, export, upload) so that `vit5_sit.hub.model_files` can resolve a
repo id without importing the module that imports it: the dependency runs one way, common.checks -> hub.files ->
hub.model_files -> hub.api. huggingface_hub is imported inside the functions that use it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from vit5_sit.common.checks import PACKAGE_ASSETS, ModelLoadError, path_problem, shown

CONFIG_FILE = "config.yaml"
WEIGHTS_FILE = "transformer/diffusion_pytorch_model.safetensors"  # the EMA weights, read by vit5-sit and diffusers
LEGACY_WEIGHTS_FILE = "ema.safetensors"  # where folders written before the diffusers layout keep them (still read)
CARD_FILE = "README.md"
METRICS_FILE = "metrics.json"
SAMPLES_FILE = "samples.png"  # a sample grid that the card shows, when the folder has one
# diffusers' layout beside ours (vit5_sit.hub.layout): the pipeline index, code and component folders
DIFFUSERS_FILES = ("model_index.json", "pipeline_vit5_sit*.py", "transformer/*", "scheduler/*", "vae/*", "guide/*")
MODEL_FILES = (CONFIG_FILE, LEGACY_WEIGHTS_FILE, CARD_FILE, METRICS_FILE, SAMPLES_FILE,
               *DIFFUSERS_FILES)  # what is downloaded and uploaded (file names and patterns)
LIBRARY_NAME = "vit5-sit"
ASSETS = PACKAGE_ASSETS  # no command may write in it (vit5_sit.common.checks.protected_output_problem)
# The models bundled with the package, by the name every entry point takes (--ckpt, from_pretrained, the page):
# the flow demo (ODE Euler 6 steps, guided) and the one-step MeanFlow demo (1 network call per image).
BUNDLED_MODELS = {"demo": ASSETS / "demo", "demo-1step": ASSETS / "demo-1step"}
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # the shape OWNER/NAME; `repo_id_problem` has the rules
_REPO_PART = re.compile(r"^\w(?:[\w.-]{0,94}\w)?$", re.ASCII)  # the Hub's rule for the owner and the name


def network_error_types() -> tuple[type[BaseException], ...]:
    """What a Hub call raises when the network or the server fails: OSError (requests' errors are OSErrors),
    huggingface_hub's HTTP errors, and the error base class of the HTTP client it uses (huggingface_hub 1.x:
    httpx; 2.x: httpx2; a bad HF_ENDPOINT: their InvalidURL). Read from the modules already imported, so
    nothing is imported for it."""
    types: list[type[BaseException]] = [OSError]
    for module_name in ("httpx2", "httpx"):
        module = sys.modules.get(module_name)
        types += [getattr(module, n) for n in ("HTTPError", "InvalidURL") if hasattr(module, n)]
    return tuple(types)


def network_failure(e: BaseException) -> str:
    """One line for a failed Hub request: the endpoint when it could not be reached, and the cause."""
    from huggingface_hub import constants

    text = str(e).strip()
    cause = f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__
    unreachable: list[type[BaseException]] = [ConnectionError, TimeoutError]  # builtins (socket errors)
    client_errors = ("TransportError", "InvalidURL")
    for module_name, names in (("httpx2", client_errors), ("httpx", client_errors),
                               ("requests", ("ConnectionError", "Timeout"))):
        module = sys.modules.get(module_name)
        unreachable += [getattr(module, n) for n in names if hasattr(module, n)]
    if not isinstance(e, tuple(unreachable)):  # e.g. no token (an OSError), a file that could not be read
        return cause
    return (f"cannot reach {constants.ENDPOINT} ({cause}); check the network connection (or HF_ENDPOINT) and run "
            "the same command again")


def repo_id_problem(repo_id: str) -> str | None:
    """Why the Hub would refuse ``repo_id`` (its own validation, checked here so that the message names the
    fix instead of raising from inside huggingface_hub), or None when it is a valid id."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_REPO_PART.match(p) for p in parts):
        return ("a Hub repo id is OWNER/NAME of letters, digits, '-', '_' and '.', each part at most 96 "
                "characters, starting and ending with a letter, digit or '_'")
    if "--" in repo_id or ".." in repo_id:
        return "a Hub repo id cannot contain '--' or '..'"
    if repo_id.endswith(".git"):
        return "a Hub repo id cannot end in .git"
    return None


def parse_repo_spec(spec: str) -> tuple[str, str | None] | None:
    """(repo_id, revision) for ``owner/name`` or ``owner/name@revision``; None for anything else."""
    from vit5_sit.data.vae import looks_like_path

    repo, _, revision = spec.partition("@")
    if looks_like_path(repo) or not _REPO_ID.match(repo):
        return None
    return repo, revision or None


RUN_ROOT = "runs"  # train.py's output_dir in every config: a missing runs/NAME is a run not trained yet


def missing_run_hint(spec: str) -> str | None:
    """How to make a missing run folder ``runs/NAME`` (or any path whose first folder exists here): the config
    whose ``name`` it is (configs/**/*.yaml of the checkout), else train.py in general; None for other specs."""
    first = Path(spec).parts[0] if Path(spec).parts else ""
    if first != RUN_ROOT and not Path(first).is_dir():
        return None
    name = Path(spec).parts[1] if len(Path(spec).parts) > 1 else Path(spec).name
    configs = Path(__file__).resolve().parent.parent.parent / "configs"
    for config in sorted(configs.rglob("*.yaml")) if configs.is_dir() else []:
        try:
            import yaml

            found = yaml.safe_load(config.read_text(encoding="utf-8"))
        except (OSError, ValueError, ImportError):
            continue
        if isinstance(found, dict) and found.get("name") == name:
            return (f"no such run or model folder; `python train.py --config {config.relative_to(configs.parent)}` "
                    f"trains it into {RUN_ROOT}/{name} (docs/training.md)")
    return ("no such run or model folder; `python train.py --config CONFIG` trains a run into runs/<its name> "
            "(docs/training.md), `python -m vit5_sit.demo export RUN --out FOLDER` makes a model folder")


def resolve_model_path(spec: str | Path, *, revision: str | None = None, cache_dir: str | Path | None = None,
                       token: str | None = None) -> Path:
    """A local path as it is; a Hub repo id (not an existing path) -> its snapshot folder in the cache."""
    problem = path_problem(str(spec))
    if problem:
        raise ModelLoadError(f"{shown(str(spec))}: {problem}")
    path = Path(spec)
    if path.exists():
        return path
    if str(spec) in BUNDLED_MODELS:
        return BUNDLED_MODELS[str(spec)]
    parsed = parse_repo_spec(str(spec))
    hint = missing_run_hint(str(spec))
    if hint is not None:  # runs/NAME: a run not trained yet, not a Hub repo of a user called "runs"
        raise ModelLoadError(f"{spec}: {hint}")
    if parsed is None:
        raise ModelLoadError(f"no such file or folder: {spec}")
    repo_id, rev = parsed
    return download_model(repo_id, revision=revision or rev, cache_dir=cache_dir, token=token,
                          not_local=str(spec))


def download_model(repo_id: str, *, revision: str | None = None, cache_dir: str | Path | None = None,
                   token: str | None = None, not_local: str | None = None) -> Path:
    """The snapshot folder of a model repo: downloaded (only our files) or, offline, from the cache.

    ``not_local``: the path the user gave, when it was taken for a repo id because no such path exists;
    errors then say both.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from vit5_sit.data.vae import hub_offline_by_env, hub_reachable

    name = repo_id + (f"@{revision}" if revision else "")
    short = f"{name}: "
    prefix = f"{not_local}: no such file or folder here; as a Hub repo id: " if not_local else short
    if (problem := repo_id_problem(repo_id)) is not None:
        raise ModelLoadError(f"{prefix}not a valid repo id: {problem}")
    offline = hub_offline_by_env() or not hub_reachable()  # one quick probe instead of retries
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, token=token,
                                        allow_patterns=list(MODEL_FILES), local_files_only=offline,
                                        library_name=LIBRARY_NAME))
    except RevisionNotFoundError:
        raise ModelLoadError(f"{short}the repo has no revision {revision!r} (a branch, tag or commit)") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"{prefix}no such model repo on the Hub (a private or gated repo needs a token: "
                             "`hf auth login` or HF_TOKEN)") from None
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE=1" if hub_offline_by_env() else f"{constants.ENDPOINT} unreachable"
        cache = cache_dir or constants.HF_HUB_CACHE
        raise ModelLoadError(
            f"{prefix}offline ({why}) and {name} is not in the Hugging Face cache ({cache}). On a connected "
            f"machine run `hf download {repo_id}` and copy the cache folder here (or point HF_HUB_CACHE at "
            "it), or pass a local model folder") from None
    except HfHubHTTPError as e:  # the server answered with an error
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"{short}download failed: {first}") from None
    except network_error_types() as e:  # the connection failed (httpx2/httpx/requests errors, timeouts)
        raise ModelLoadError(f"{short}download failed: {network_failure(e)}") from None
    if not (folder / CONFIG_FILE).is_file() or not any((folder / w).is_file() for w in (WEIGHTS_FILE,
                                                                                         LEGACY_WEIGHTS_FILE)):
        found = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        raise ModelLoadError(f"{short}not a vit5-sit model repo (needs {CONFIG_FILE} and {WEIGHTS_FILE}; "
                             f"found: {', '.join(found) or 'none of our files'})")
    return folder
