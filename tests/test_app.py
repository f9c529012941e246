"""The web demo (vit5_sit.demo.app): started on a free localhost port and driven with gradio_client to produce a
grid; localhost unless --host says otherwise; the library imports without Gradio."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from vit5_sit.config import load_config, save_config
from vit5_sit.demo import app as demo_app
from vit5_sit.models import create_model

ROOT = Path(__file__).resolve().parent.parent
TINY = ["name=tiny-app", "model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=64", "model.num_heads=2",
        "data.kind=mnist", "data.resolution=8", "sampler.steps=3", "log.sample_cfg_scale=2.0",
        "log.sample_guidance_interval=[0.0,0.6]"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("model")
    cfg = load_config(None, TINY)
    torch.manual_seed(0)
    model = create_model(cfg.model_config())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_config(cfg, folder / "config.yaml")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "ema.safetensors"))
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # importing Gradio and starting its server: ~15 s
def test_page_on_localhost_draws_the_grid(model_dir, tmp_path, monkeypatch):
    pytest.importorskip("gradio")
    from gradio_client import Client

    from vit5_sit.pipeline import Vit5SitPipeline
    from vit5_sit.sampling.generate import save_labelled_grid

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    page = demo_app.build_app(str(model_dir), out_dir=tmp_path / "out")
    port = _free_port()
    page.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, ssr_mode=False, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        classes, guidance, low, high, sampler, method, steps, about = client.predict(str(model_dir), api_name="/load")
        assert (classes, guidance, low, high, sampler, method, steps) == ("0-9", 2.0, 0.0, 0.6, "ode", "euler", 3)
        assert "tiny-app" in about
        grid, download, info = client.predict(str(model_dir), "1,4", 3, 2.5, 0.0, 1.0, "sde", "heun", 4, 7,
                                              api_name="/generate")
        assert "2 classes x 3 images, sde/heun 4 steps, guidance 2.5, seeds 7-12" in info
        got = np.asarray(Image.open(grid))
        assert np.array_equal(np.asarray(Image.open(download)), got)
        # the same grid as the pipeline (and so sample.py) gives for these seeds and settings
        pipe = Vit5SitPipeline.from_pretrained(model_dir)
        images = pipe([1, 1, 1, 4, 4, 4], guidance_scale=2.5, guidance_interval=(0.0, 1.0), sampler="sde",
                      method="heun", num_inference_steps=4, seed=7).images
        save_labelled_grid(np.stack([np.asarray(i) for i in images]), tmp_path / "want.png", 3,
                           ["class 1", "class 4"])
        assert np.array_equal(got, np.asarray(Image.open(tmp_path / "want.png")))
        with pytest.raises(Exception, match="class id 99 out of range"):
            client.predict(str(model_dir), "99", 1, 1.0, 0.0, 1.0, "ode", "euler", 2, 0, api_name="/generate")
        # Values outside the page's widgets reach our checks (the setting and its range), not Gradio's wording.
        with pytest.raises(Exception, match="images per class 999: choose a whole number in 1-"):
            client.predict(str(model_dir), "1", 999, 1.0, 0.0, 1.0, "ode", "euler", 2, 0, api_name="/generate")
        with pytest.raises(Exception, match=r"guide from t / to t \(2.0, 1.0\): must be in \[0, 1\]"):
            client.predict(str(model_dir), "1", 1, 2.0, 2.0, 1.0, "ode", "euler", 2, 0, api_name="/generate")
        with pytest.raises(Exception, match="steps 0: choose a whole number in 1-"):
            client.predict(str(model_dir), "1", 1, 1.0, 0.0, 1.0, "ode", "euler", 0, 0, api_name="/generate")
    finally:
        page.close()


def _until(condition, timeout: float = 30.0):
    """Poll ``condition`` until it returns something true (then that), failing after ``timeout`` seconds."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := condition():
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


@pytest.mark.slow  # a Gradio server (~15 s with Gradio's import, ~2 s without)
def test_api_has_named_parameters_step_progress_and_a_bounded_queue(model_dir, tmp_path, monkeypatch):
    """Through gradio_client: /generate's parameters have names (were param_0 ... param_9); a call reports the
    sampler's steps while it runs; the next calls wait in one queue and learn their place; past max_queue,
    calls are turned away. The sampler is held by a stand-in until the test lets it finish."""
    pytest.importorskip("gradio")
    import threading

    from gradio_client import Client
    from gradio_client.utils import Status

    release = threading.Event()

    def held_grid(models, out_dir, *args, max_evals, on_step):
        for done in (1, 2, 3):
            on_step(done, 3)
        release.wait(60)
        path = Path(out_dir) / f"grid-{args[-1]}.png"
        Image.new("RGB", (4, 4)).save(path)
        return path, f"seed {args[-1]}"

    monkeypatch.setattr(demo_app, "generate_grid", held_grid)
    page = demo_app.build_app(str(model_dir), out_dir=tmp_path, max_queue=2)
    port = _free_port()
    page.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, ssr_mode=False, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
        assert set(api) == {"/generate", "/load"}  # the page's own button is not an API endpoint
        assert [p["parameter_name"] for p in api["/generate"]["parameters"]] == [
            "model", "classes", "images_per_class", "guidance_scale", "guide_from_t", "guide_to_t", "sampler",
            "method", "steps", "seed"]
        kw = dict(model=str(model_dir), classes="0,1", images_per_class=1, guidance_scale=1.0, guide_from_t=0.0,
                  guide_to_t=1.0, sampler="ode", method="euler", steps=2)
        first = client.submit(**kw, seed=1, api_name="/generate")
        step = _until(lambda: (first.status().progress_data or [None])[0])
        assert (step.length, step.unit, step.desc) == (3, "network evaluations", "sampling")
        second = client.submit(**kw, seed=2, api_name="/generate")
        waiting = _until(lambda: second.status().code == Status.IN_QUEUE and second.status())
        assert (waiting.rank, waiting.queue_size) == (0, 1)  # next in line, one waiting
        third = client.submit(**kw, seed=3, api_name="/generate")
        assert _until(lambda: third.status().code == Status.IN_QUEUE and third.status()).rank == 1
        fourth = client.submit(**kw, seed=4, api_name="/generate")
        with pytest.raises(Exception, match="Queue is full"):
            fourth.result(timeout=30)
        release.set()
        assert [job.result(timeout=30)[2] for job in (first, second, third)] == ["seed 1", "seed 2", "seed 3"]
    finally:
        release.set()
        page.close()


GOOD = dict(classes="0,1", per_class=2, guidance=1.0, interval_low=0.0, interval_high=1.0, sampler="ode",
            method="euler", steps=2, seed=0)


@pytest.mark.parametrize("change, message", [
    # the page's widgets bound these, but its API takes any value: each was an int()/float() traceback,
    # a silent truncation (seed 1.5), or an unbounded job (steps 10**9, 1000 classes x 16)
    (dict(seed=None), "seed None: give a whole number"),
    (dict(seed=1.5), "seed 1.5: choose a whole number in 0-4294967295"),
    (dict(seed=-1), "seed -1: choose a whole number"),
    (dict(steps=10**9), "steps 1000000000: choose a whole number in 1-250"),
    (dict(steps=float("nan")), "steps nan: choose a whole number"),
    (dict(per_class=0), "images per class 0: choose a whole number in 1-16"),
    (dict(interval_low=None), "guide from t None: give a number"),
    (dict(guidance=float("inf")), "guidance scale inf: give a finite number"),
    (dict(classes="0-9,0-9,0-9,0-9,0-9,0-9,0-9", per_class=4), "70 classes x 4 images = 280: at most 256"),
    (dict(classes=None), "no classes in ''"),
])
def test_generate_checks_every_value_before_sampling(model_dir, tmp_path, change, message):
    models = demo_app.Models()
    with pytest.raises(demo_app.DemoError, match=message.replace("(", r"\(").replace(")", r"\)")):
        demo_app.generate_grid(models, tmp_path, str(model_dir), **{**GOOD, **change})
    path, info = demo_app.generate_grid(models, tmp_path, str(model_dir), **GOOD)
    assert path.is_file() and "2 classes x 2 images" in info


def test_localhost_unless_host_is_given(model_dir, monkeypatch, capsys):
    pytest.importorskip("gradio")
    calls = []

    class Page:
        def launch(self, **kwargs):
            calls.append(kwargs)

    monkeypatch.setattr(demo_app, "build_app", lambda model, allowed=None, **kw: Page())
    assert demo_app.main(["--model", str(model_dir)]) == 0
    assert calls[-1]["server_name"] == "127.0.0.1" and calls[-1]["share"] is False
    assert demo_app.main(["--host", "0.0.0.0", "--port", "8000"]) == 0
    assert (calls[-1]["server_name"], calls[-1]["server_port"]) == ("0.0.0.0", 8000)
    assert "warning: listening on 0.0.0.0" in capsys.readouterr().out


def test_a_grid_is_bounded_in_network_evaluations(model_dir, tmp_path):
    """images x evaluations (x 2 guided) at most max_evals: fixed-step solvers refused before sampling, adaptive
    ones stopped once past it (a 160-image dopri5 grid at guidance 10 held the only worker for minutes)."""
    models, calls = demo_app.Models(), []
    ok = dict(GOOD, guidance=2.0)  # 4 images x 2 Euler steps x 2 (guided) = 16
    path, info = demo_app.generate_grid(models, tmp_path, str(model_dir), **ok, max_evals=16,
                                        on_step=lambda *a: calls.append(a))
    assert path.is_file() and calls == [(1, 2), (2, 2)]  # the pipeline's step hook, passed through
    with pytest.raises(demo_app.DemoError, match=r"^4 images x 2 network evaluations x 2 \(guided\) = 16: more "
                                                 "than the 15 a grid may take here; take fewer images or steps"):
        demo_app.generate_grid(models, tmp_path, str(model_dir), **ok, max_evals=15)
    calls.clear()
    with pytest.raises(demo_app.DemoError, match=r"^ode/dopri5 stopped: 4 images x more than 3 network evaluations "
                                                 "exceeds the 12 a grid may take here; take fewer images, a "
                                                 "fixed-step method"):
        demo_app.generate_grid(models, tmp_path, str(model_dir), **dict(GOOD, method="dopri5"), max_evals=12,
                               on_step=lambda *a: calls.append(a))
    assert calls == [(1, None), (2, None), (3, None), (4, None)]  # stopped at once, not after the whole solve
    with pytest.raises(demo_app.DemoError, match=r"^4 images x 2 \(guided\): more than the 7 network evaluations"):
        demo_app.generate_grid(models, tmp_path, str(model_dir), **ok, max_evals=7)
    assert demo_app.MAX_IMAGES * 2 * (demo_app.MAX_STEPS + 1) > demo_app.MAX_EVALS  # the per-value caps alone
    # did not bound a call: the largest grid they allowed was 256 images x 501 evaluations x 2


def _page_fn(page, name: str):
    return next(f.fn for f in page.fns.values() if f.fn is not None and f.fn.__name__ == name)


def test_page_keeps_the_last_grid_on_a_bad_input(model_dir, tmp_path):
    """The page's button answers a bad input with a warning and a line, not an error that blanks the grid; the
    API's /generate (the same inputs) still fails, so a gradio_client caller gets the error."""
    gr = pytest.importorskip("gradio")
    page = demo_app.build_app(str(model_dir), out_dir=tmp_path)
    on_page, api = _page_fn(page, "generate_on_page"), _page_fn(page, "generate")
    args = [str(model_dir), "0,1", 2, 1.0, 0.0, 1.0, "ode", "euler", 2, 0]
    grid, download, info = on_page(*args, progress=lambda *a, **k: None)
    assert Path(grid).is_file() and "2 classes x 2 images" in info
    with pytest.warns(UserWarning, match="class id 99 out of range"):
        kept = on_page(*[str(model_dir), "99", *args[2:]], progress=lambda *a, **k: None)
    assert kept[:2] == (gr.skip(), gr.skip())  # the grid and its download stay
    assert kept[2].startswith("**Not drawn:** class id 99 out of range") and "last one drawn" in kept[2]
    with pytest.raises(gr.Error, match="class id 99 out of range"):
        api(*[str(model_dir), "99", *args[2:]], progress=lambda *a, **k: None)
    deps = {d["api_name"]: d for d in page.config["dependencies"] if d.get("api_name")}
    assert deps["generate"]["api_visibility"] == "public" and deps["generate_on_page"]["api_visibility"] == "private"


def _dependency(page, fn_name: str) -> dict:
    index = next(i for i, f in page.fns.items() if f.fn is not None and f.fn.__name__ == fn_name)
    return next(d for d in page.config["dependencies"] if d["id"] == index)


def test_one_step_button_draws_and_every_grid_has_one_progress_bar(model_dir, tmp_path):
    """(#53) The "one-step demo" button filled the form and stopped: it now draws the one-step demo's grid too,
    after the form is filled (and only if it was); a grid showed three progress bars (one per output)."""
    pytest.importorskip("gradio")
    page = demo_app.build_app(str(model_dir), out_dir=tmp_path)
    fill = _dependency(page, "fill_one_step")
    then = [d for d in page.config["dependencies"] if d["trigger_after"] == fill["id"]]
    assert len(then) == 1 and then[0]["trigger_only_on_success"]
    assert page.fns[then[0]["id"]].fn.__name__ == "generate_on_page"
    grid_id = next(b._id for b in page.blocks.values() if getattr(b, "label", None) == "grid")
    for d in page.config["dependencies"]:
        if grid_id in d["outputs"]:  # a call that draws a grid: its bar on the grid only
            assert d["show_progress_on"] == [grid_id], d["api_name"]
        else:  # filling the form: no bar over each field
            assert d["show_progress"] == "hidden", d["api_name"]
    # what the button does, in order: the form, then the grid of that form
    name, classes, guidance, low, high, sampler, method, steps, about = _page_fn(page, "fill_one_step")()
    assert (name, sampler, steps, guidance, low, high) == (demo_app.DEMO_1STEP, "meanflow", 1, 3.0, 0.0, 1.0)  # iMF
    grid, download, info = _page_fn(page, "generate_on_page")(
        name, classes, 1, guidance, low, high, sampler, method, steps, 0, progress=lambda *a, **k: None)
    assert Path(grid).is_file() and "10 classes x 1 images, meanflow/euler 1 steps" in info


@pytest.mark.parametrize("model, change, control", [
    (demo_app.DEMO_1STEP, dict(sampler="ode"), "use sampler meanflow, 1 step by default, steps k"),
    ("tiny", dict(sampler="meanflow"), "use an ODE or SDE sampler (sampler ode / sde)"),
    ("tiny", dict(sampler="sde", method="dopri5"), "method dopri5 (sampler sde): must be one of 'euler', 'heun'"),
    ("tiny", dict(sampler="bogus"), "sampler bogus: must be one of"),
    ("tiny", dict(guidance=-3.0), "guidance scale -3.0: must be in [0, 1000]"),
    ("tiny", dict(guidance=2.0, interval_low=0.8, interval_high=0.2), "guide from t / to t 0.8 0.2: need 0 <="),
    ("tiny", dict(seed=2**32 - 1), "seed 4294967295: sample seeds must lie in"),
])
def test_page_errors_name_the_pages_controls_not_cli_flags(model_dir, tmp_path, model, change, control):
    """A bad setting on the page is named as the page names it (the guidance scale slider, the sampler radio
    button), not as sample.py's flag (--cfg-scale), the pipeline's argument (guidance_scale) or a config key."""
    models = demo_app.Models()
    with pytest.raises(demo_app.DemoError) as e:
        demo_app.generate_grid(models, tmp_path, str(model_dir) if model == "tiny" else model, **{**GOOD, **change})
    message = str(e.value)
    assert control in message
    assert not re.search(r"(?<![\w-])--[a-z]|guidance_scale|guidance_interval|num_inference_steps|class_labels|"
                         r"SamplerConfig|sampler\.\w+=|(?<![\w.])(seed|sampler|method|steps|cfg_scale)=",
                         message), message


@pytest.mark.parametrize("message, shown", [
    ("--cfg-scale 3: this model has guidance trained in; leave --cfg-scale at 1",
     "guidance scale 3: this model has guidance trained in; leave guidance scale at 1"),
    ("num_images_per_prompt=0: must be at least 1", "images per class 0: must be at least 1"),
    ("--steps 0 (sampler.steps=0): must be at least 1", "steps 0: must be at least 1"),
    ("class_labels=[1.5]: whole class ids", "classes [1.5]: whole class ids"),
    ("the --guide-channels-like word cfg_scale_x stays", "the --guide-channels-like word cfg_scale_x stays"),
    ("sample it unguided (--cfg-scale 1, guidance_scale=1, no --guide)", "sample it unguided (guidance scale 1, no "
                                                                          "--guide)"),  # the two spellings: one
])
def test_in_page_words_renames_flags_arguments_and_keys(message, shown):
    assert demo_app.in_page_words(message) == shown


def test_help_and_docs_state_the_evaluation_cap_against_the_demos_grid():
    """`app --help` and docs/demo.md said the cap was 4x the demo's grid (true of the SDE 50 grid; 34x of Euler 6):
    the figures are derived from DEMO_GRID, which is checked against the bundled demo's config."""
    import yaml

    demo = yaml.safe_load((ROOT / "vit5_sit" / "assets" / "demo" / "config.yaml").read_text())
    images, steps, guided = demo_app.DEMO_GRID
    assert images == demo["model"]["num_classes"] * demo_app.DEFAULT_PER_CLASS
    assert (demo["sampler"]["mode"], demo["sampler"]["method"], demo["sampler"]["steps"]) == ("ode", "euler", steps)
    assert guided == (2 if demo["log"]["sample_cfg_scale"] != 1 else 1)
    ratio = demo_app.MAX_EVALS // demo_app.DEMO_GRID_EVALS
    assert (demo_app.DEMO_GRID_EVALS, ratio) == (480, 34)
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        demo_app.main(["--help"])
    assert f"{ratio}x the demo's default grid ({demo_app.DEMO_GRID_EVALS:,}: {images} digits x {steps} Euler" in \
        " ".join(out.getvalue().split())
    page = " ".join((ROOT / "docs" / "demo.md").read_text().split())
    assert (f"(default {demo_app.MAX_EVALS:,}: {ratio} times the demo's default grid, {images} x {steps} x {guided} "
            f"= {demo_app.DEMO_GRID_EVALS:,}") in page
    assert (f"draws at most {demo_app.MAX_IMAGES} images ({demo_app.MAX_PER_CLASS} per class, {demo_app.MAX_STEPS} "
            "steps) per grid") in page
    assert f"`--max-queue` calls (default {demo_app.MAX_QUEUE};" in page


def test_model_box_serves_only_the_allowed_models(model_dir, tmp_path, monkeypatch):
    """A page on another address (or with --allow) loads only the models its owner named: a page user could
    otherwise make it read any folder of the machine or download any Hub repo."""
    other = tmp_path / "other"
    other.mkdir()
    models = demo_app.Models(allowed=[str(model_dir)])
    # the same folder under another spelling is the same model
    monkeypatch.chdir(model_dir.parent)
    assert models.get(f"./{model_dir.name}/") is models.get(str(model_dir))
    for name in (str(other), "someone/huge-repo", "demo", "/etc", "x" * 5000):
        with pytest.raises(demo_app.DemoError, match=f"this page serves only {re.escape(str(model_dir))}; "
                                                     r"whoever started it can offer more with --allow"):
            models.get(name)
    # refused before anything is read or downloaded: nothing loaded besides the allowed model
    assert list(models._pipes) == [str(model_dir.resolve())]
    with pytest.raises(demo_app.DemoError, match="this page serves only"):
        demo_app.generate_grid(models, tmp_path, "someone/huge-repo", **GOOD)
    assert demo_app.Models().get(str(model_dir))  # no list: anything (the localhost default)


def test_allow_flag_and_the_host_set_what_the_page_serves(model_dir, monkeypatch, capsys):
    pytest.importorskip("gradio")
    calls = []

    class Page:
        def launch(self, **kwargs):
            pass

    monkeypatch.setattr(demo_app, "build_app",
                        lambda model, allowed=None, **kw: calls.append((model, allowed)) or Page())
    m = str(model_dir)
    assert demo_app.main(["--model", m]) == 0 and calls[-1] == (m, None)  # localhost: any model
    assert demo_app.main(["--model", m, "--host", "0.0.0.0"]) == 0 and calls[-1] == (m, [])  # network: --model only
    assert f"it serves {m} only (--allow adds others)" in capsys.readouterr().out
    assert demo_app.main(["--model", m, "--host", "0.0.0.0", "--allow", "a/b, c/d"]) == 0
    assert calls[-1] == (m, ["a/b", "c/d"])
    assert demo_app.main(["--host", "0.0.0.0", "--allow", "any"]) == 0 and calls[-1] == ("demo", None)
    assert "it serves any model folder of this machine or Hub repo" in capsys.readouterr().out
    assert demo_app.main(["--model", m, "--allow", "a/b"]) == 0 and calls[-1] == (m, ["a/b"])  # localhost, narrowed
    with pytest.raises(SystemExit):
        demo_app.main(["--allow", " , "])
    assert "argument --allow: give model names, comma-separated, or 'any'" in capsys.readouterr().err


def test_bad_model_is_one_line(tmp_path, capsys):
    pytest.importorskip("gradio")
    assert demo_app.main(["--model", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --model: model {tmp_path / 'missing'}: ") and len(err.splitlines()) == 1
    assert "no such run or model folder" in err and "python train.py --config CONFIG" in err  # how to make one


@pytest.mark.parametrize("port, message", [
    ("0", "must be in [1024, 65535]"), ("99999", "must be in [1024, 65535]"), ("-1", "must be in [1024, 65535]"),
    ("80", "below 1024 only root may listen"),  # privileged: refused with the reason, not a PermissionError
    ("٣", "expected an integer in ASCII digits"), ("１２", "expected an integer in ASCII digits"),  # int() read 3, 12
])
def test_a_port_out_of_range_is_refused_before_the_model_loads(port, message, capsys):
    with pytest.raises(SystemExit):  # 99999 was an OverflowError traceback from the server, after loading
        demo_app.main(["--port", port])
    err = capsys.readouterr().err
    assert "argument --port: " in err and message in err, err


@pytest.mark.parametrize("module, argv, message", [
    ("vit5_sit.cli.eval_fid", ["ref", "--data", "d", "--out", "r.npz", "--num-workers", "-1"],
     "argument --num-workers: must be 0 or more"),  # started the Inception pass
    ("vit5_sit.demo", ["export", "runs/x", "--cfg-scale", "nan"], "argument --cfg-scale: must be a finite number"),
    ("vit5_sit.demo", ["export", "runs/x", "--steps", "0"], "argument --steps: must be at least 1"),
])
def test_other_commands_name_their_bad_numbers(module, argv, message, capsys):
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(module).main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.slow  # a fresh interpreter importing torch
def test_library_imports_and_app_explains_without_gradio():
    code = ("import sys; sys.modules['gradio'] = None\n"
            "import vit5_sit.demo.app, vit5_sit.pipeline, vit5_sit.hub.api\n"
            "sys.exit(vit5_sit.demo.app.main([]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT)
    assert proc.returncode == 2
    want = "error: the web demo needs Gradio: pip install 'vit5-sit[app]' (or pip install gradio)"
    assert proc.stderr.strip() == want


def test_console_entry_points_import_and_answer_help():
    """[project.scripts] in pyproject.toml: every target imports and its main() takes an argv list."""
    import importlib

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"vit5-sit-sample", "vit5-sit-train", "vit5-sit-eval", "vit5-sit-demo"}
    for target in scripts.values():
        module, _, func = target.partition(":")
        main = getattr(importlib.import_module(module), func)
        with pytest.raises(SystemExit) as exit_:
            main(["--help"])
        assert exit_.value.code == 0


def test_the_page_says_when_a_model_guides_with_its_own_guide(tmp_path):
    """A model folder carrying autoguidance's guide/: the page's model line says the scale is autoguidance's."""
    from vit5_sit.pipeline import Vit5SitPipeline

    cfg = load_config(None, ["model.preset=ViT5-T/4", "model.depth=1", "model.hidden_size=32", "model.num_heads=2",
                             "data.kind=mnist", "data.resolution=8"])
    main, guide = (create_model(cfg.model_config()) for _ in range(2))
    assert "autoguidance" not in demo_app.model_defaults(Vit5SitPipeline(main, cfg))["about"]
    assert "autoguidance" in demo_app.model_defaults(Vit5SitPipeline(main, cfg, guide=guide))["about"]
