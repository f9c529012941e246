"""``train.init_from``: start a run from a trained flow model's weights (issue #51: flow models into one-step models).

A user already owns flow models (a run of this toolkit, a model folder such as the bundled demo, the official
SiT-XL/2 ``.pt`` file). ``train.init_from=PATH`` builds the run's model as usual, then copies every weight of the
flow model into it; what only the new objective has starts so that it changes nothing:

- MeanFlow's ``interval_embedder`` (the interval length t - r): its last layer at zero, so its term in the
  conditioning is 0 and the converted model predicts exactly the flow model's velocity, for every interval, at
  step 0 (bit for bit: tests/test_init_from.py);
- with DMF's split (``model.dmf_depth``) there is no interval embedder: the later blocks see the interval's end
  t + d through the flow model's own time embedder, which is t at d = 0, so the converted model is again the flow
  model at step 0 (the same test);
- iMF's ``guidance_embedder``: zero last layers already, as every fresh model's (`Denoiser`'s init, the one place
  that decides it; the bit-for-bit test would catch a change there).

A converted x-prediction model (``model.x_prediction=true``, pMF's output: the network gives the data point and the
average velocity follows from it) cannot start as the flow model: the flow model's last linear layer gives a
velocity, which that output cannot express (it would need x_t, which the last layer does not see). That layer starts
at zero (every fresh model's) and is learned again; the trunk, every block and embedder, comes from the flow model.

The fine-tuning then learns the average velocity from a model that already knows the instantaneous one. The EMA
starts at the converted weights (the flow model's EMA weights, which are the ones worth keeping). The model's
architecture must be the flow model's: every field of the model config but the objective's inputs (``mean_flow``,
``guidance_input``, ``x_prediction``, ``dmf_depth``) must agree, and a disagreement is one line naming each field
and both values. A run that resumes reads its own checkpoint: ``init_from`` is read at step 0 only.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from vit5_sit.common.checks import ModelLoadError
from vit5_sit.models.config import ModelConfig

# The inputs the objective adds: what a flow model's config lacks and the converted model's has.
OBJECTIVE_INPUTS = ("mean_flow", "guidance_input", "x_prediction", "dmf_depth")
# The last linear layer, which an x-prediction model learns again (its output is a data point, not a velocity).
X_PRED_HEAD = ("final_layer.linear.weight", "final_layer.linear.bias")
OFFICIAL_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")


def flow_config(mcfg: ModelConfig) -> ModelConfig:
    """The flow model ``mcfg`` converts from: the same model without the objective's inputs (their defaults)."""
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name in OBJECTIVE_INPUTS}
    return dataclasses.replace(mcfg, **defaults)


class InitFromError(ValueError):
    """``train.init_from`` names nothing a run can start from; the message says why and what to give."""


def load_teacher(spec: str, mcfg: ModelConfig) -> tuple[nn.Module, str]:
    """``meanflow.teacher``: the flow model ``spec`` names (as `flow_state` reads it: the run's architecture without
    the objective's inputs), frozen and in eval mode, and a line saying what it is."""
    from vit5_sit.models import create_model

    state, what = flow_state(spec, mcfg, key="meanflow.teacher")
    teacher = create_model(flow_config(mcfg))
    teacher.load_state_dict(state)
    return teacher.eval().requires_grad_(False), what


def flow_state(spec: str, mcfg: ModelConfig, key: str = "train.init_from") -> tuple[dict[str, torch.Tensor], str]:
    """The (EMA) weights of the flow model ``spec`` names, checked against the run's model ``mcfg``, and a line
    saying what they are. ``spec``: a run folder (its newest valid checkpoint), a checkpoint folder, a model folder
    (or a bundled model's name, e.g. ``demo``), or an official SiT ``.pt`` file (read as ``mcfg`` without the
    objective's inputs, e.g. SiT-XL/2 at 256 px)."""
    from vit5_sit.hub.model_files import load_for_sampling, local_model_path
    from vit5_sit.models import create_model, load_official_state_dict
    from vit5_sit.models.official import StateDictMismatch

    flow_cfg = flow_config(mcfg)
    try:
        path = local_model_path(spec)  # a Hub repo id: its cached (or downloaded) snapshot
    except ModelLoadError as e:
        raise InitFromError(f"{key}={spec}: {e}") from None
    if not path.exists():
        raise InitFromError(f"{key}={spec}: no such file or folder; give a flow run folder, a checkpoint "
                            "folder, a model folder (e.g. demo) or an official SiT .pt file")
    if path.is_file():
        if path.suffix not in OFFICIAL_SUFFIXES:
            raise InitFromError(f"{key}={spec}: a file must be an official SiT checkpoint "
                                f"({', '.join(OFFICIAL_SUFFIXES)}); our runs and model folders are given as folders")
        model = create_model(flow_cfg)
        try:
            load_official_state_dict(model, path)
        except (StateDictMismatch, ValueError, FileNotFoundError) as e:
            raise InitFromError(f"{key}={spec}: {e}") from None
        return model.state_dict(), f"the official SiT file {path.name}"
    try:
        model, source_cfg = load_for_sampling(path)
    except ModelLoadError as e:
        raise InitFromError(f"{key}={spec}: {e}") from None
    source = model.cfg
    tr = getattr(source_cfg, "transport", None)
    if tr is not None and (tr.path, tr.prediction) != ("linear", "velocity"):
        raise InitFromError(f"{key}={spec}: a flow model with transport.path={tr.path}, prediction={tr.prediction}; "
                            "MeanFlow builds on the linear path's velocity: give a linear-path velocity model")
    if any(getattr(source, k) for k in OBJECTIVE_INPUTS):
        raise InitFromError(f"{key}={spec}: a MeanFlow model already (model.mean_flow=True); "
                            f"{key} takes flow models (a MeanFlow run continues with --resume)")
    differing = [f"{f.name}={getattr(source, f.name)!r} there, {getattr(flow_cfg, f.name)!r} here"
                 for f in dataclasses.fields(ModelConfig)
                 if f.name not in OBJECTIVE_INPUTS and getattr(source, f.name) != getattr(flow_cfg, f.name)]
    if differing:
        raise InitFromError(f"{key}={spec}: its model is not this run's: {'; '.join(differing)}; give "
                            "this run the flow model's model section (its preset and overrides)")
    step = _step_of(path)
    return model.state_dict(), f"the flow model {path}" + (f" at step {step:,}" if step is not None else "")


def _step_of(path: Path) -> int | None:
    from vit5_sit.hub.model_files import resolve_checkpoint

    try:
        folder, _ = resolve_checkpoint(path)
    except ModelLoadError:
        return None
    name = folder.name
    return int(name.split("_")[-1]) if name.startswith("step_") and name.split("_")[-1].isdigit() else None


def convert(model: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Copy the flow weights ``state`` into ``model`` (a `Denoiser` of the same architecture, possibly with the
    objective's inputs) and start the interval input neutral; returns the names of the parameters that did not come
    from ``state``. Any other missing or unexpected weight is an error (a different architecture)."""
    own = model.state_dict()
    new = sorted(k for k in own if k not in state)
    extra = sorted(k for k in state if k not in own)
    foreign = [k for k in new if not k.startswith(("interval_embedder.", "guidance_embedder."))]
    relearned = X_PRED_HEAD if getattr(getattr(model, "cfg", None), "x_prediction", False) else ()
    if extra or foreign:
        raise InitFromError(f"train.init_from: the flow weights do not fit this model (missing {foreign[:3]}, "
                            f"unexpected {extra[:3]}); give a flow model of this run's architecture")
    shapes = [f"{k}: {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in own.items()
              if k in state and state[k].shape != v.shape]
    if shapes:
        raise InitFromError(f"train.init_from: the flow weights' shapes differ from this model's ({shapes[0]})")
    with torch.no_grad():
        for k, v in own.items():
            if k in state and k not in relearned:
                v.copy_(state[k].to(v.dtype))
        interval = getattr(model, "interval_embedder", None)
        if interval is not None:  # its term in the conditioning is 0: the converted model is the flow model
            nn.init.zeros_(interval.mlp[2].weight)
            nn.init.zeros_(interval.mlp[2].bias)
        for k in relearned:  # x-prediction: the velocity head is not copied, it starts at zero (learned again)
            nn.init.zeros_(own[k])
    return sorted([*new, *relearned])
