"""``train.init_from``: a flow model converted into a MeanFlow / iMF model starts as the flow model, bit for bit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tinydata import TINY_TRAIN, image_folder

from vit5_sit.config import load_config, with_overrides
from vit5_sit.hub.model_files import load_for_sampling
from vit5_sit.models import create_model
from vit5_sit.train.checkpoint import list_checkpoints
from vit5_sit.train.init_from import InitFromError, convert, flow_state

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.mark.parametrize("imf", [False, True], ids=["meanflow", "imf"])
def test_the_converted_demo_is_the_demo_bit_for_bit(imf):
    """The bundled 3,600-step flow demo converted: every interval, every guidance input, the same velocity."""
    flow, _ = load_for_sampling("demo")
    mcfg = dataclasses.replace(flow.cfg, mean_flow=True, guidance_input=imf)
    torch.manual_seed(1)
    model = create_model(mcfg).eval()
    state, what = flow_state("demo", mcfg)
    new = convert(model, state)
    assert "flow model" in what and new and all(k.startswith(("interval_embedder.", "guidance_embedder."))
                                                for k in new)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 1, 32, 32, generator=g)
    t = torch.rand(6, generator=g)
    y = torch.tensor([0, 3, 7, 9, 10, 10])  # 10: the null label
    kw = {"guidance": torch.tensor([[2.5, 0.0, 1.0]]).expand(6, 3)} if imf else {}
    with torch.no_grad():
        want = flow(x, t, y)
        for interval in (torch.zeros(6), torch.rand(6, generator=g)):
            assert torch.equal(model(x, t, y, interval=interval, **kw), want)



@pytest.mark.parametrize("imf", [False, True], ids=["meanflow", "imf"])
def test_the_demo_converted_with_dmfs_split_is_the_demo_at_interval_zero(imf):
    """DMF's decoupled conditioning (model.dmf_depth): no new interval weights; at d = 0 the flow model, bit for
    bit; at d > 0 the first dmf_depth blocks are unchanged and only the later ones see the interval (its end)."""
    flow, _ = load_for_sampling("demo")
    mcfg = dataclasses.replace(flow.cfg, mean_flow=True, guidance_input=imf, dmf_depth=4)
    torch.manual_seed(1)
    model = create_model(mcfg).eval()
    assert model.interval_embedder is None
    new = convert(model, flow_state("demo", mcfg)[0])
    assert all(k.startswith("guidance_embedder.") for k in new) and bool(new) == imf
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 1, 32, 32, generator=g)
    t = 0.6 * torch.rand(6, generator=g)
    d = 0.4 * torch.rand(6, generator=g)
    y = torch.tensor([0, 3, 7, 9, 10, 10])
    kw = {"guidance": torch.tensor([[2.5, 0.0, 1.0]]).expand(6, 3)} if imf else {}
    with torch.no_grad():
        want, hidden = flow(x, t, y, return_hidden=(4, 5))
        assert torch.equal(model(x, t, y, interval=torch.zeros(6), **kw), want)
        out, moved = model(x, t, y, interval=d, return_hidden=(4, 5), **kw)
        assert torch.equal(moved[4], hidden[4])            # the encoder sees t alone
        assert not torch.allclose(moved[5], hidden[5])     # the decoder sees t + d
        # ... exactly as the flow model's later blocks do at the time t + d (the decoder's conditioning)
        c_end = flow.t_embedder(t + d) + flow.y_embedder(y)
        assert torch.equal(c_end, model.t_embedder(t + d) + model.y_embedder(y))
        assert not torch.allclose(out, want)

def _runs(tmp_path: Path) -> tuple[Path, list[str]]:
    data = image_folder(tmp_path / "data")
    return data, [*TINY_TRAIN, f"output_dir={tmp_path}", "data.kind=images", f"data.path={data}",
                  "data.resolution=8", "data.channels=3", "model.num_classes=2", "train.global_batch_size=4"]


def test_a_meanflow_run_starts_from_a_flow_run_and_resumes_its_own(tmp_path):
    from vit5_sit.train.loop import train

    _, common = _runs(tmp_path)
    flow_run = train(load_config(None, [*common, "name=flow", "train.max_steps=2"]))
    flow_ema = load_file(str(list_checkpoints(flow_run)[-1].path / "ema.safetensors"))
    lines = []
    # lr 1e-30: the steps move no trained weight by an ulp, so the checkpoint holds the weights the run started from.
    mf = [*common, "name=mf", "train.objective=meanflow", "meanflow.variant=imf", f"train.init_from={flow_run}",
          "train.lr=1e-30", "train.warmup_steps=0", "train.max_steps=2"]
    run = train(load_config(None, mf), log_fn=lines.append)
    assert any(line.startswith(f"init_from: the flow model {flow_run}") and "at step 2" in line
               and "guidance_embedder, interval_embedder" in line for line in lines), lines
    start = load_file(str(list_checkpoints(run)[-1].path / "model.safetensors"))
    assert set(start) - set(flow_ema) and all(torch.equal(start[k], v) for k, v in flow_ema.items())
    for k in ("interval_embedder.mlp.2.weight", "interval_embedder.mlp.2.bias"):  # zero, but for 2 steps of 1e-30
        assert start[k].abs().max() < 1e-25, k
    # A resume reads its own checkpoint (init_from may then point anywhere, even nowhere).
    lines.clear()
    train(load_config(None, [*mf, "train.init_from=gone", "train.max_steps=4"]), resume="auto",
          log_fn=lines.append)
    assert not any(line.startswith("init_from") for line in lines)
    assert [c.step for c in list_checkpoints(run)] == [2, 4]


def test_what_cannot_be_converted_is_one_line(tmp_path):
    from vit5_sit.train.loop import TrainingError, train

    _, common = _runs(tmp_path)
    flow_run = train(load_config(None, [*common, "name=flow", "train.max_steps=2"]))
    mf = [*common, "train.objective=meanflow", "train.max_steps=2"]
    cases = {
        "missing": ([f"train.init_from={tmp_path / 'nope'}"], "no such file or folder"),
        "other-width": ([f"train.init_from={flow_run}", "model.hidden_size=64"], "hidden_size=32 there, 64 here"),
        "a-text-file": ([f"train.init_from={tmp_path / 'data' / 'class0' / '0.png'}"],
                        "a file must be an official SiT checkpoint"),
    }
    for name, (extra, needle) in cases.items():
        with pytest.raises(TrainingError) as e:
            train(load_config(None, [*mf, f"name={name}", *extra]))
        assert needle in str(e.value) and "\n" not in str(e.value), (name, str(e.value))
        assert not (tmp_path / name).exists(), name  # nothing left behind
    mf_run = train(load_config(None, [*mf, "name=mf"]))
    with pytest.raises(TrainingError, match="a MeanFlow model already"):
        train(load_config(None, [*mf, "name=again", f"train.init_from={mf_run}"]))


def test_an_empty_init_from_is_a_config_error():
    from vit5_sit.config import ConfigError

    with pytest.raises(ConfigError, match="train.init_from=''"):
        load_config(None, ["train.init_from="])


def test_convert_refuses_weights_of_another_architecture():
    flow, _ = load_for_sampling("demo")
    model = create_model(dataclasses.replace(flow.cfg, mean_flow=True))
    state = dict(flow.state_dict())
    state.pop("final_layer.linear.bias")
    with pytest.raises(InitFromError, match="final_layer.linear.bias"):
        convert(model, state)


def test_an_official_sit_file_converts_bit_for_bit(tmp_path):
    """The official SiT layout (a raw state dict .pt, read weights_only) into an iMF model of the same preset."""
    flow = create_model("SiT-T/4", input_size=8, in_channels=4, num_classes=3, depth=2).eval()
    torch.save(flow.state_dict(), tmp_path / "SiT-official.pt")
    mcfg = dataclasses.replace(flow.cfg, mean_flow=True, guidance_input=True)
    model = create_model(mcfg).eval()
    state, what = flow_state(str(tmp_path / "SiT-official.pt"), mcfg)
    convert(model, state)
    assert what == "the official SiT file SiT-official.pt"
    x, t, y = torch.randn(3, 4, 8, 8), torch.rand(3), torch.tensor([0, 2, 3])
    with torch.no_grad():
        assert torch.equal(model(x, t, y, interval=torch.rand(3), guidance=torch.tensor([[4.0, 0.2, 0.8]] * 3)),
                           flow(x, t, y))
    with pytest.raises(InitFromError, match="SiT-official.pt"):  # another width: the file does not fit
        flow_state(str(tmp_path / "SiT-official.pt"), dataclasses.replace(mcfg, hidden_size=96))


def test_export_measured_rows_join_the_card_and_name_their_checkpoint(tmp_path):
    """`demo export --measured`: bench_guidance records of the exported checkpoint become the card's metrics rows,
    the folder's default guidance first; a record of another model is one error."""
    import json

    from vit5_sit.common.checks import ModelLoadError
    from vit5_sit.demo.export import DEMO_MODEL, measured_rows

    row = {"cell": "cfg@2.5", "guidance": "cfg", "guide": None, "scale": 2.5, "interval": [0.0, 1.0], "seed": 0,
           "steps": 6, "nfe": 12, "num_samples": 1000, "digit_accuracy": 0.994, "speckle": 0.0005, "fid": 48.3,
           "sfid": 86.1, "precision": 0.195, "recall": 0.257}
    unguided = {**row, "cell": "cfg@1", "scale": 1.0, "fid": 67.3, "digit_accuracy": 0.872}
    auto = {**row, "cell": "auto:folder@3@0-0.5", "guidance": "auto", "guide": "folder", "scale": 3.0,
            "interval": [0.0, 0.5], "nfe": 10, "fid": 36.5, "digit_accuracy": 0.99}
    record = tmp_path / "demo.json"
    record.write_text(json.dumps({"model": str(DEMO_MODEL), "reference": "runs/study/reference.npz",
                                  "rows": [unguided, row, auto]}))
    cfg = load_config(DEMO_MODEL / "config.yaml")  # its default: autoguidance 3 on [0, 0.5]
    rows = measured_rows([record], DEMO_MODEL, cfg)
    assert [r["settings"] for r in rows] == ["n1000_seed0_ode_euler_6steps_auto3_guide-folder_gi0-0.5",
                                             "n1000_seed0_ode_euler_6steps_cfg1", "n1000_seed0_ode_euler_6steps_cfg2.5"]
    assert rows[0]["fid"] == 36.5 and rows[2]["speckle"] == 0.0005 and rows[0]["reference"] == "reference.npz"
    cfg25 = with_overrides(cfg, ["log.sample_cfg_scale=2.5", "log.sample_guidance_interval=[0.0, 1.0]"])
    assert measured_rows([record], DEMO_MODEL, cfg25)[0]["settings"] == "n1000_seed0_ode_euler_6steps_cfg2.5"
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"model": str(DEMO_MODEL.parent / "demo-1step"), "rows": [row]}))
    with pytest.raises(ModelLoadError, match="not .*demo; give the records of the exported checkpoint"):
        measured_rows([other], DEMO_MODEL, cfg)


def test_a_hub_id_not_in_the_cache_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    flow, _ = load_for_sampling("demo")
    with pytest.raises(InitFromError, match="train.init_from=nobody/nothing: .*offline") as e:
        flow_state("nobody/nothing", dataclasses.replace(flow.cfg, mean_flow=True))
    assert "\n" not in str(e.value)
