"""MeanFlow under DDP (issue 51, item 3): the gradients of a MeanFlow step are all-reduced over processes.

`torch.func.jvp` through a DDP-wrapped module skips DDP's forward, and with it the gradient all-reduce: each
process then steps on its own half of the batch, silently. Ours computes the JVP target without gradient on the
bare model and the prediction with gradient through the wrapper. Two checks, over 2 gloo CPU processes:
- the gradients of one step, on each rank, equal those of one process on the whole global batch, while the
  pattern of the public re-implementations (the prediction taken from the JVP's primal output) leaves each rank
  with its own gradients: the check can fail;
- a 2-process training run (`accelerate launch`, train.py) ends with the checkpoint of the 1-process run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from tinydata import TINY_TRAIN, image_folder, reset_accelerate

from vit5_sit.config import load_config
from vit5_sit.models import create_model
from vit5_sit.models.layers import forward_ad_ops
from vit5_sit.train.checkpoint import list_checkpoints
from vit5_sit.train.objective import Batch, MeanFlowObjective, StepRng, Trainee, _bare_model
from vit5_sit.transport import Transport
from vit5_sit.transport.meanflow import MeanFlowConfig, meanflow_loss

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

WORLD, GLOBAL_BATCH, SEED, STEP = 2, 4, 3, 5
MEANFLOW = MeanFlowConfig(ratio=1.0, guidance_scale=2.0)  # every sample through the JVP, the guidance pass too
IMF = MeanFlowConfig(ratio=1.0, variant="imf")            # iMF: guidance inputs drawn, JVP along the network's v
CONFIGS = {"meanflow": MEANFLOW, "imf": IMF}


def _model(imf: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    model = create_model("ViT5G-T/4", input_size=8, in_channels=1, num_classes=3, depth=1, hidden_size=32,
                         num_heads=2, mean_flow=True, guidance_input=imf)
    with torch.no_grad():  # leave adaLN-Zero's zeros: every weight gets a gradient
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    return model


def _batch() -> Batch:
    g = torch.Generator().manual_seed(1)
    return Batch(torch.randn(GLOBAL_BATCH, 1, 8, 8, generator=g), torch.tensor([0, 1, 2, 1]))


class PublicPattern(MeanFlowObjective):
    """The trap, deliberately: the prediction with gradient is the primal output of `torch.func.jvp` on the
    bare model (one pass instead of two), so DDP's forward never runs and its all-reduce is skipped."""

    def __call__(self, net, batch, rng):
        t, d, noise, drop, _ = self.draw(rng, tuple(batch.x1.shape[1:]))
        y = self.drop_labels(batch.y, drop)
        x_t, v = self.transport.interpolate(noise, batch.x1, t)
        model = _bare_model(net)
        with forward_ad_ops():
            pred, dudt = torch.func.jvp(lambda x, tt, dd: model(x, tt, y, interval=dd), (x_t, t, d),
                                        (v, torch.ones_like(t), -torch.ones_like(d)))
        target = (v + d.view(-1, 1, 1, 1) * dudt).detach()
        return {"loss": meanflow_loss(pred, target, self.cfg)[0].mean()}


def _grads(net: torch.nn.Module, objective, rows: slice) -> torch.Tensor:
    """One step's gradient, flattened, for the rows ``rows`` of the global batch."""
    batch = _batch()
    rng = StepRng(SEED, STEP, GLOBAL_BATCH, rows)
    objective(net, Batch(batch.x1[rows], batch.y[rows]), rng)["loss"].backward()
    grads = torch.cat([p.grad.flatten() for p in net.parameters() if p.requires_grad])
    net.zero_grad(set_to_none=True)
    return grads


RUNS_OF_A_RANK = {"meanflow": (MeanFlowObjective, MEANFLOW), "imf": (MeanFlowObjective, IMF),
                  "public-pattern": (PublicPattern, MEANFLOW)}


def _rank(rank: int, store: str, out: str) -> None:
    """One gloo process: each objective's gradient on this rank's rows, through DDP; rank 0 saves all ranks'."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        micro = GLOBAL_BATCH // WORLD
        rows = StepRng.for_micro_batch(SEED, STEP, GLOBAL_BATCH, 0, micro, rank, WORLD).rows
        result = {}
        for name, (kind, cfg) in RUNS_OF_A_RANK.items():
            model = _model(cfg.imf)
            net = torch.nn.parallel.DistributedDataParallel(Trainee(model))
            g = _grads(net, kind(Transport(), model.null_label, 0.25, cfg), rows)
            every = [torch.empty_like(g) for _ in range(WORLD)]
            dist.all_gather(every, g)
            result[name] = torch.stack(every)
        if rank == 0:
            torch.save(result, out)
        dist.barrier()  # both ranks done before either tears gloo down
    finally:
        dist.destroy_process_group()


def test_meanflow_gradients_are_all_reduced_under_ddp(tmp_path):
    import torch._dynamo  # noqa: F401 - DDP imports it (seconds): once, here, before the fork
    import torch.multiprocessing as mp

    out = tmp_path / "grads.pt"
    # Forked, not spawned: the processes start with torch and the package already imported.
    mp.start_processes(_rank, args=(str(tmp_path / "store"), str(out)), nprocs=WORLD, start_method="fork")
    ranks = torch.load(out, weights_only=True)
    one = {}
    for name, cfg in CONFIGS.items():  # one process, the whole global batch
        model = _model(cfg.imf)
        one[name] = _grads(Trainee(model), MeanFlowObjective(Transport(), model.null_label, 0.25, cfg),
                           slice(0, GLOBAL_BATCH))
        assert one[name].abs().max() > 1e-3
        ours = ranks[name]
        assert torch.equal(ours[0], ours[1]), name  # all-reduced: every rank steps with the same gradient ...
        torch.testing.assert_close(ours[0], one[name], atol=1e-7, rtol=1e-5, msg=name)  # ... the global batch's
    # The trap: each rank keeps the gradient of its own rows (what the checks above would catch).
    trap = ranks["public-pattern"]
    assert (trap[0] - trap[1]).abs().max() > 1e-3
    assert (trap[0] - one["meanflow"]).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------------------
# The whole loop: 2 processes through accelerate against 1 process, checkpoint for checkpoint.

RUNS = {"meanflow": ["train.objective=meanflow", "sampler.mode=meanflow", "sampler.method=euler",
                     "sampler.steps=1", "meanflow.guidance_scale=2", "meanflow.ratio=0.5"],
        "imf": ["train.objective=meanflow", "sampler.mode=meanflow", "sampler.method=euler", "sampler.steps=1",
                "meanflow.variant=imf", "meanflow.ratio=0.5"]}


def _overrides(root: Path, name: str, data: Path, objective: str) -> list[str]:
    return [*TINY_TRAIN, f"output_dir={root}", f"name={name}", "data.kind=images", f"data.path={data}",
            "data.resolution=8", "data.channels=3", "model.num_classes=2", "train.global_batch_size=4",
            "train.max_steps=2", *RUNS[objective]]


def _final(run: Path) -> dict[str, torch.Tensor]:
    ckpt = list_checkpoints(run)[-1].path
    return {**load_file(str(ckpt / "model.safetensors")),
            **{f"ema.{k}": v for k, v in load_file(str(ckpt / "ema.safetensors")).items()}}


@pytest.mark.slow
@pytest.mark.parametrize("objective", sorted(RUNS))
def test_two_processes_end_with_the_checkpoint_of_one(tmp_path, objective):
    from vit5_sit.train.loop import train

    data = image_folder(tmp_path / "data")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    two = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                          str(ROOT / "train.py"), *_overrides(tmp_path, "two", data, objective)],
                         env=env, capture_output=True, text=True)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "2 processes (MULTI_CPU" in two.stdout, two.stdout[-2000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each of the two processes: the same reduction order
    try:
        reset_accelerate()
        train(load_config(None, _overrides(tmp_path, "one", data, objective)))
    finally:
        torch.set_num_threads(threads)
    a, b = _final(tmp_path / "one"), _final(tmp_path / "two")
    assert a.keys() == b.keys()
    assert a["final_layer.linear.weight"].abs().max() > 1e-5  # zero at initialisation: the run trained
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=3e-8, rtol=0, msg=k)


# ---------------------------------------------------------------------------------------------------------
# The non-finite guard sees the JVP target, not only the loss.

def _nan_in_the_jvp(monkeypatch) -> None:
    """dU/dt of the JVP (its tangent output) gets a NaN in one element."""
    from vit5_sit.models import Denoiser

    real = Denoiser.jvp

    def jvp(self, primals, tangents, y):
        out, dout = real(self, primals, tangents, y)
        dout = dout.clone()
        dout.view(-1)[0] = float("nan")
        return out, dout

    monkeypatch.setattr(Denoiser, "jvp", jvp)


def test_nan_in_the_jvp_target_is_a_non_finite_term():
    model = _model()
    objective = MeanFlowObjective(Transport(), model.null_label, 0.0, MEANFLOW)
    terms = objective(Trainee(model), _batch(), StepRng(SEED, STEP, GLOBAL_BATCH, slice(0, GLOBAL_BATCH)))
    assert torch.isfinite(terms["target"]) and terms["target"] > 0
    with pytest.MonkeyPatch.context() as mp:
        _nan_in_the_jvp(mp)
        terms = objective(Trainee(model), _batch(), StepRng(SEED, STEP, GLOBAL_BATCH, slice(0, GLOBAL_BATCH)))
    assert torch.isnan(terms["target"])


@pytest.mark.parametrize("masked", [False, True], ids=["plain-loss", "loss-masks-the-nan"])
def test_nan_in_du_dt_skips_the_step_even_with_a_finite_loss(tmp_path, monkeypatch, masked):
    """A NaN in dU/dt skips the step and stops the run after train.max_nonfinite, named in the log; also when
    the loss itself stays finite (here a loss that zeroes non-finite targets, as a robust loss might)."""
    from vit5_sit.train import objective as objective_module
    from vit5_sit.train.loop import TrainingError, train

    _nan_in_the_jvp(monkeypatch)
    if masked:
        real = objective_module.meanflow_loss
        monkeypatch.setattr(objective_module, "meanflow_loss",
                            lambda pred, target, cfg: real(pred, torch.nan_to_num(target, nan=0.0), cfg))
    logs: list[str] = []
    data = image_folder(tmp_path / "data")
    cfg = load_config(None, [*_overrides(tmp_path, "nan", data, "meanflow"), "meanflow.ratio=1",
                             "train.max_nonfinite=3", "train.max_steps=4"])
    with pytest.raises(TrainingError, match="3 non-finite steps in a row"):
        train(cfg, log_fn=logs.append)
    skipped = [line for line in logs if "step skipped" in line]
    assert len(skipped) == 3 and all("target nan" in line for line in skipped), logs
    assert all(("loss nan" in line) != masked for line in skipped)  # masked: the loss was finite
    assert list_checkpoints(tmp_path / "nan")[-1].step == 2  # steps 1-2 skipped and saved, stopped at 3
    ema = load_file(str(list_checkpoints(tmp_path / "nan")[-1].path / "ema.safetensors"))
    assert ema["final_layer.linear.weight"].abs().max() == 0  # no step taken: still the zero initialisation
