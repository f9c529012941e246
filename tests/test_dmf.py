"""DMF's decoupled conditioning (``model.dmf_depth``, Decoupled MeanFlow): the first k blocks see the time t, the
later blocks and the output layer the interval's end t + d, through the one time embedder. Its JVP is checked with
every other switch (tests/test_meanflow.py), its conversion from the demo in tests/test_init_from.py; here: the
bad values, the card, and a trained DMF run's folder loaded by diffusers without the package, bit for bit."""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import pytest
import torch
from test_diffusers_folder import OUTSIDE, _ours, run_without_package
from test_meanflow import _inputs, _model
from tinydata import TINY_TRAIN, image_folder

from vit5_sit.config import ConfigError, load_config
from vit5_sit.models.config import ModelConfig

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.mark.parametrize("kwargs,match", [
    (dict(dmf_depth=1), r"dmf_depth=1 is DMF's split .* needs mean_flow=True"),
    (dict(mean_flow=True, depth=4, dmf_depth=4), r"dmf_depth=4 with depth=4: .* in \[1, 3\]"),
    (dict(mean_flow=True, dmf_depth=-1), r"dmf_depth=-1: must be >= 0"),
    (dict(mean_flow=True, dmf_depth=1.5), r"dmf_depth=1.5: must be an integer"),
    (dict(mean_flow=True, dmf_depth=True), r"dmf_depth=True: must be an integer"),
])
def test_a_bad_dmf_depth_is_one_line_naming_it(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**kwargs)


def test_a_flow_config_with_dmf_depth_is_a_config_error():
    with pytest.raises(ConfigError, match="dmf_depth=2 is DMF's split"):
        load_config("configs/mnist/vit5g.yaml", ["model.dmf_depth=2"])
    cfg = load_config("configs/mnist/convert-demo-imf-dmf.yaml")
    assert cfg.model_config().dmf_depth == 4 and cfg.model_config().mean_flow


def test_the_interval_reaches_only_the_blocks_after_dmf_depth():
    """With the interval embedder every block moves with d; with DMF's split the first k blocks do not."""
    m = _model("ViT5G-T/4", dmf_depth=1)
    assert m.interval_embedder is None
    (x, t, d), _, y = _inputs()
    with torch.no_grad():
        _, at_t = m(x, t, y, interval=torch.zeros_like(d), return_hidden=(1, 2))
        out, moved = m(x, t, y, interval=d, return_hidden=(1, 2))
        # the decoder at interval d is the decoder at interval 0 from the time t + d: the same conditioning
        end, _ = m(x, t + d, y, interval=torch.zeros_like(d), return_hidden=(1,))
    assert torch.equal(moved[1], at_t[1]) and not torch.allclose(moved[2], at_t[2])
    assert not torch.allclose(out, end)  # ... but from the encoder's features at t, not at t + d


def test_the_card_names_the_split():
    from vit5_sit.hub.api import meanflow_rows

    rows = dict(meanflow_rows(load_config("configs/mnist/convert-demo-imf-dmf.yaml")))
    assert rows["conditioning"].startswith("DMF's split: the first 4 blocks")
    assert "conditioning" not in dict(meanflow_rows(load_config("configs/mnist/convert-demo-imf.yaml")))


def test_a_dmf_runs_folder_loads_in_diffusers_without_the_package(tmp_path):
    """A trained DMF model (iMF, guidance an input), exported: diffusers alone samples it in 1 and 2 steps, guided at
    sampling time, bit for bit as Vit5SitPipeline does (the folder's code is the package's, the split included)."""
    from vit5_sit.demo.export import export_model
    from vit5_sit.pipeline import Vit5SitPipeline
    from vit5_sit.train.loop import train

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data = image_folder(tmp_path / "data")
    cfg = load_config(None, [*TINY_TRAIN, f"output_dir={tmp_path}", "name=dmf", "data.kind=images",
                             f"data.path={data}", "data.resolution=8", "data.channels=3", "model.num_classes=2",
                             "train.global_batch_size=4", "train.max_steps=2", "model.depth=2", "model.dmf_depth=1",
                             "train.objective=meanflow", "meanflow.variant=imf"])
    folder = export_model(train(cfg), tmp_path / "folder", samples=False)
    calls = {"one": dict(class_labels=[0, 1], seed=0),
             "two": dict(class_labels=[1, 0], seed=4, num_inference_steps=2, guidance_scale=2.0)}
    script = OUTSIDE.split("# diffusers' own step loop")[0] + textwrap.dedent("""
        result["dmf_depth"] = pipe.transformer.config.dmf_depth
        print(json.dumps(result))
    """)
    out = tmp_path / "out"
    out.mkdir()
    proc = run_without_package(script, [str(folder), str(out), json.dumps(calls)], out)
    assert json.loads(proc.stdout.strip().splitlines()[-1])["dmf_depth"] == 1
    pipe = Vit5SitPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    for name, kwargs in calls.items():
        assert np.array_equal(_ours(pipe, kwargs), np.load(out / f"{name}.npy")), name
