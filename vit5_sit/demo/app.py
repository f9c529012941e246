"""A browser demo: pick a model, classes, guidance, sampler and seed; see the grid and download it.

    pip install -e '.[app]'                      # Gradio
    python -m vit5_sit.app                       # the bundled demo model, on http://127.0.0.1:7860
    vit5-sit-demo --model runs/mnist-vit5        # any run, checkpoint or model folder, or a Hub repo id
    vit5-sit-demo --host 0.0.0.0 --port 8000     # listen on every address: reachable from the network
    vit5-sit-demo --host 0.0.0.0 --allow me/vit5-mnist,runs/mnist-sit   # ... offering two more models

It listens on localhost only unless --host names another address. On localhost the model box loads any
run, checkpoint, model folder or Hub repo; on another address it serves only --model and the models that
--allow names (``--allow any`` lifts that), so a page reachable from the network cannot be made to read other
folders of this machine or download arbitrary repos. Generation is `Vit5SitPipeline` (the
images of ``sample.py`` for the same seeds and settings: image i of the grid has seed SEED + i); the demo
model draws its 40-digit grid with its folder's sampler defaults (ODE Euler, 6 steps, autoguidance 3 with
its guide on t in [0, 0.5]: 10 network evaluations a batch) in the time ``python sample.py`` takes; fewer
images per class or steps are quicker. A grid may take at most --max-evals
network evaluations (images x evaluations, x 2 when guided; dopri5 is stopped past it), one grid is drawn at a
time and up to --max-queue calls wait, each shown its place. Gradio is imported only here, so the library
works without it.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import re
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from vit5_sit.common.checks import integer, path_text, positive_int
from vit5_sit.common.contract import MIN_PORT, Parser
from vit5_sit.common.interrupt import stops_cleanly

DEFAULT_HOST = "127.0.0.1"   # localhost only; other addresses need --host
DEFAULT_PORT = 7860          # Gradio's usual port
DEMO = "demo"                # the model box's name for the bundled demo model
DEMO_1STEP = "demo-1step"    # the bundled one-step MeanFlow demo (vit5_sit.hub.files.BUNDLED_MODELS)
MAX_PER_CLASS = 16
DEFAULT_PER_CLASS = 4        # the page's "images per class" at start: the demo's grid is 10 classes x 4
MAX_STEPS = 250
MAX_IMAGES = 256             # images per grid: the page (and its API) is a demo, not a batch job
MAX_EVALS = 16_384           # image-evaluations of the network per grid (a guided one counts 2), adaptive solvers
#                              included: 34x the demo's default grid (DEMO_GRID_EVALS); set when that grid was
#                              SDE 50 steps (40 x 51 x 2 = 4,080), as 4x it
DEMO_GRID = (10 * DEFAULT_PER_CLASS, 6, 2)  # the demo's default grid: 40 digits x Euler 6 steps x 2 (guided);
#                              tests/test_app.py checks it against vit5_sit/assets/demo/config.yaml
DEMO_GRID_EVALS = math.prod(DEMO_GRID)
MAX_QUEUE = 16               # calls waiting for the sampler; more are turned away ("queue is full")
KEEP_MODELS = 2              # pipelines kept loaded (switching back and forth does not reload)
METHODS = ("dpm++2m", "dpm++3m", "euler", "heun", "dopri5")  # the page's choices: fixed-step solvers (DPM-Solver++
# multistep first: one network call a step, all 40 demo digits right from 6 steps) and one adaptive
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # a local demo sends no usage reports


class DemoError(ValueError):
    """A bad value in the page; shown there as one line."""


# The page's controls under the names the package's messages give their values (sample.py's flags, the pipeline's
# arguments, config keys): a message shown on the page names the slider or radio button to change instead.
PAGE_CONTROLS = {
    "guidance scale": ("--cfg-scale", "guidance_scale", "cfg_scale", "log.sample_cfg_scale"),
    "guide from t / to t": ("--guidance-interval", "guidance_interval"),
    "sampler": ("--sampler", "sampler.mode"),
    "method": ("--method", "sampler.method"),
    "steps": ("--steps", "num_inference_steps", "sampler.steps"),
    "seed": ("--seed",),
    "classes": ("--classes", "class_labels"),
    "images per class": ("--per-class", "num_images_per_prompt"),
    "model": ("--ckpt", "--model"),
}
_CONTROL = {name: label for label, names in PAGE_CONTROLS.items() for name in names}
_NAMED = re.compile(r"(?<![\w.-])(" + "|".join(sorted(map(re.escape, _CONTROL), key=len, reverse=True))
                    + r")(?![\w-])(=?)")
_CONFIG_ALSO = re.compile(r" \((?:sampler|log)\.[\w.]+=[^)]*\)")  # "--sampler meanflow (sampler.mode=meanflow)"
_SAMPLER_CONFIG = re.compile(r"^sampler / method / num_inference_steps: SamplerConfig(?:\(mode='(\w+)'\))?\."
                             r"(\w+)='([^']*)'")  # the pipeline's check of the three, in dataclass terms
_SAMPLER_FIELDS = {"mode": "sampler", "method": "method", "steps": "steps"}
_ASSIGNED = re.compile(r"(?<![\w.-])(seed|sampler|method|steps)=")  # 'seed=5: ...' as the page writes it: 'seed 5'
_REPEATED = re.compile(r"\b((?:" + "|".join(map(re.escape, PAGE_CONTROLS)) + r")[^,;()]*)(?:, \1\b)+")  # 'the flag,
# the argument' alternatives, which the page names alike


def in_page_words(message: str) -> str:
    """``message`` with every value named as the page names it: 'guidance_scale=-3' and '--cfg-scale -3' are
    'guidance scale -3', and "SamplerConfig(mode='sde').method='dopri5'" is 'method dopri5 (sampler sde)'."""
    message = _SAMPLER_CONFIG.sub(lambda m: f"{_SAMPLER_FIELDS.get(m.group(2), m.group(2))} {m.group(3)}"
                                  + (f" (sampler {m.group(1)})" if m.group(1) else ""), message)
    message = _ASSIGNED.sub(r"\1 ", _CONFIG_ALSO.sub("", message))
    message = _NAMED.sub(lambda m: _CONTROL[m.group(1)] + (" " if m.group(2) else ""), message)
    return _REPEATED.sub(r"\1", message)


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
ANY = "any"                  # --allow any: the model box loads whatever it is given


def model_key(name) -> str:
    """One spelling per model: 'demo' for an empty box, a local path resolved (./runs/x == runs/x), else the text."""
    name = str(name or "").strip() or DEMO
    if name == DEMO:
        return DEMO
    try:
        path = Path(name).expanduser()
        if path.exists():
            return str(path.resolve())
    except (OSError, ValueError):  # a name too long for the OS, a NUL byte: not a local path
        pass
    return name


class Models:
    """Pipelines by model name, the last few kept loaded; ``allowed`` (names), if given, the only ones served."""

    def __init__(self, keep: int = KEEP_MODELS, allowed=None):
        self.keep, self._pipes = keep, OrderedDict()
        self.allowed = None if allowed is None else list(dict.fromkeys(str(a).strip() or DEMO for a in allowed))
        self._allowed_keys = None if allowed is None else {model_key(a) for a in self.allowed}

    def get(self, name: str):
        from vit5_sit.config import ConfigError
        from vit5_sit.hub.model_files import ModelLoadError
        from vit5_sit.pipeline import Vit5SitPipeline

        name = str(name or "").strip() or DEMO
        key = model_key(name)
        if self._allowed_keys is not None and key not in self._allowed_keys:
            from vit5_sit.common.checks import shown

            raise DemoError(f"model {shown(name)}: this page serves only {', '.join(self.allowed)}; whoever started "
                            "it can offer more with --allow NAME[,NAME...] (or --allow any)")
        if key not in self._pipes:
            try:
                pipe = Vit5SitPipeline.from_pretrained(None if name == DEMO else name)
            except (ModelLoadError, ConfigError, FileNotFoundError) as e:
                raise DemoError(f"model {name}: {e}") from None
            pipe.set_progress_bar_config(disable=True)
            self._pipes[key] = pipe
            while len(self._pipes) > self.keep:
                self._pipes.popitem(last=False)
        self._pipes.move_to_end(key)
        return self._pipes[key]


def model_defaults(pipe) -> dict:
    """What the page shows for a model before the user changes anything: its grid classes, guidance (scale and
    interval) and sampler."""
    from vit5_sit.common.classes import grid_classes, imagenet_name

    cfg, mcfg = pipe.config, pipe.model.cfg
    classes = grid_classes(mcfg.num_classes)
    if mcfg.num_classes == 1000:
        text = ", ".join(imagenet_name(c) for c in classes)
    elif classes == list(range(len(classes))):
        text = f"0-{len(classes) - 1}"
    else:
        text = ",".join(map(str, classes))
    params = sum(p.numel() for p in pipe.model.parameters())
    kind = f"latents via {cfg.data.vae}" if pipe.latent else "pixels"
    about = (f"**{cfg.name}**: `{cfg.model.preset}`, {params / 1e6:.2f}M parameters, {mcfg.num_classes} classes, "
             f"{cfg.data.resolution}px {kind}, {cfg.train.max_steps:,} training steps")
    if getattr(pipe, "guide", None) is not None:  # the folder carries a guide: the scale weighs the model against it
        about += ("; guidance is **autoguidance** with the guide the model folder carries (guide + scale x "
                  "(model - guide))")
    low, high = cfg.log.sample_guidance_interval
    return {"classes": text, "guidance": cfg.log.sample_cfg_scale, "low": low, "high": high,
            "sampler": cfg.sampler.mode,
            "method": cfg.sampler.method if cfg.sampler.method in METHODS else "euler",
            "steps": cfg.sampler.steps, "about": about}


def _ascii(value):
    """``value``, or ValueError for text with digits of other scripts (float('٣') is 3.0)."""
    if isinstance(value, str) and not value.isascii():
        raise ValueError(value)
    return value


def _whole(name: str, value, low: int, high: int) -> int:
    try:
        number = float(_ascii(value))
    except (TypeError, ValueError):
        raise DemoError(f"{name} {value!r}: give a whole number") from None
    if not number.is_integer() or not low <= number <= high:
        raise DemoError(f"{name} {value!r}: choose a whole number in {low}-{high}")
    return int(number)


def _real(name: str, value) -> float:
    try:
        number = float(_ascii(value))
    except (TypeError, ValueError):
        raise DemoError(f"{name} {value!r}: give a number") from None
    if not math.isfinite(number):
        raise DemoError(f"{name} {value!r}: give a finite number")
    return number


def generate_grid(models: Models, out_dir: Path, model: str, classes: str, per_class: int, guidance: float,
                  interval_low: float, interval_high: float, sampler: str, method: str, steps: int,
                  seed: int, *,
                  max_evals: int = MAX_EVALS,  # image-evaluations of the network per grid (guided: 2 each)
                  on_step: Callable[[int, int | None], None] | None = None,  # the pipeline's step hook
                  ) -> tuple[Path, str]:
    """Sample a labelled grid (one row per class, ``per_class`` images from seeds seed, seed+1, ...), write
    it as a PNG in ``out_dir``; returns its path and a one-line summary.

    Its cost is bounded: images x network evaluations (x 2 when guided) at most ``max_evals``. A fixed-step
    solver over it is refused before sampling; an adaptive one (dopri5) is stopped once it passes it."""
    from vit5_sit.common.classes import ClassSpecError, class_label, parse_classes
    from vit5_sit.data.vae import VAELoadError
    from vit5_sit.pipeline import NFELimitError
    from vit5_sit.sampling.generate import sampler_settings, save_labelled_grid, steps_per_batch
    from vit5_sit.transport.samplers import FIXED_STEP_METHODS

    pipe = models.get(model)
    n = pipe.model.cfg.num_classes
    # The page's widgets bound these, but its API (gradio_client) passes any value: each is checked here.
    per_class = _whole("images per class", per_class, 1, MAX_PER_CLASS)
    steps = _whole("steps", steps, 1, MAX_STEPS)
    seed = _whole("seed", seed, 0, 2**32 - 1)
    guidance, interval_low, interval_high = (_real(name, v) for name, v in (
        ("guidance scale", guidance), ("guide from t", interval_low), ("to t", interval_high)))
    try:
        ids = parse_classes("" if classes is None else str(classes), n)
        labels = [c for c in ids for _ in range(per_class)]
        if len(labels) > MAX_IMAGES:
            raise DemoError(f"{len(ids)} classes x {per_class} images = {len(labels)}: at most {MAX_IMAGES} per "
                            "grid here; use sample.py for more")
        guided = 2 if float(guidance) != 1.0 else 1  # a guided evaluation runs the network on two copies
        max_nfe = max_evals // (len(labels) * guided)  # per image, so per batch too
        if max_nfe < 1:
            raise DemoError(f"{len(labels)} images{' x 2 (guided)' if guided > 1 else ''}: more than the "
                            f"{max_evals:,} network evaluations a grid may take here; take fewer images")
        start = time.perf_counter()
        out = pipe(class_labels=labels, guidance_scale=float(guidance), guidance_interval=(interval_low, interval_high),
                   sampler=sampler, method=method, num_inference_steps=steps, seed=seed, max_nfe=max_nfe,
                   on_step=on_step)
    except NFELimitError:
        evals = steps_per_batch(sampler_settings(pipe.config.sampler, sampler, method, steps))
        cost = f"{len(labels)} images x {{}} network evaluations{' x 2 (guided)' if guided > 1 else ''}"
        if evals is None:  # adaptive: stopped once past the bound
            raise DemoError(f"{sampler}/{method} stopped: {cost.format(f'more than {max_nfe}')} exceeds the "
                            f"{max_evals:,} a grid may take here; take fewer images, a fixed-step method, or "
                            "sample.py") from None
        raise DemoError(f"{cost.format(evals)} = {len(labels) * evals * guided:,}: more than the {max_evals:,} "
                        "a grid may take here; take fewer images or steps, or sample.py") from None
    except (ClassSpecError, VAELoadError, ValueError) as e:
        raise DemoError(in_page_words(str(e))) from None
    import numpy as np

    images = np.stack([np.asarray(im) for im in out.images])
    key = hashlib.sha256(repr((model, labels, guidance, interval_low, interval_high, sampler, method, steps,
                               seed)).encode()).hexdigest()[:12]
    path = save_labelled_grid(images, out_dir / f"vit5-sit-grid-{key}.png", per_class,
                              [class_label(c, n) for c in ids])
    what = f"{sampler}/{method}" + (f" {steps} steps" if method in FIXED_STEP_METHODS else "")
    where = "" if (interval_low, interval_high) == (0.0, 1.0) or guidance == 1 else \
        f" on t in [{interval_low:g}, {interval_high:g}]"
    info = (f"{len(ids)} classes x {per_class} images, {what}, guidance {float(guidance):g}{where}, seeds {seed}-"
            f"{seed + len(labels) - 1}: {time.perf_counter() - start:.1f} s")
    return path, info


def build_app(model: str = DEMO, out_dir: str | Path | None = None, allowed=None, *, max_evals: int = MAX_EVALS,
              max_queue: int = MAX_QUEUE):
    """The Gradio page (not launched). ``model``: the model box's initial value; ``allowed``: if given, the only
    models the box loads (``model`` is always among them); ``max_evals``: image-evaluations of the network a grid
    may take (guided: 2 each); ``max_queue``: calls that may wait for the sampler, which runs one at a time.

    Its API (gradio_client) has ``/generate`` with named parameters (an input error raises) and ``/load``. The
    page's own generate button shows a bad input as a warning and keeps the last grid; both report the
    sampler's progress step by step and share one queue, whose position Gradio shows to whoever waits."""
    import gradio as gr

    models = Models(allowed=None if allowed is None else [model, *allowed, DEMO, DEMO_1STEP])  # bundled: always
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="vit5-sit-app-"))
    first = model_defaults(models.get(model))

    def load(name):
        try:
            d = model_defaults(models.get(name))
        except DemoError as e:
            raise gr.Error(str(e)) from None
        return d["classes"], d["guidance"], d["low"], d["high"], d["sampler"], d["method"], d["steps"], d["about"]

    def fill_one_step():
        """The one-step demo button's first half: the model box and the form set to the one-step demo's defaults
        (the second half draws its grid)."""
        return DEMO_1STEP, *load(DEMO_1STEP)

    tracker = gr.Progress()  # Gradio gives each call its own, fed by the sampler's step hook

    def draw(args: tuple, progress) -> tuple[str, str, str]:
        def on_step(done: int, total: int | None) -> None:
            progress((done, total), desc="sampling", unit="network evaluations")

        path, info = generate_grid(models, out_dir, *args, max_evals=max_evals, on_step=on_step)
        return str(path), str(path), info

    def generate(model: str, classes: str, images_per_class: int, guidance_scale: float, guide_from_t: float,
                 guide_to_t: float, sampler: str, method: str, steps: int, seed: int, progress=tracker):
        """The API's /generate: the grid (image and download) and its summary; a bad input is an error."""
        try:
            return draw((model, classes, images_per_class, guidance_scale, guide_from_t, guide_to_t, sampler,
                         method, steps, seed), progress)
        except DemoError as e:
            raise gr.Error(str(e)) from None

    def generate_on_page(model: str, classes: str, images_per_class: int, guidance_scale: float,
                         guide_from_t: float, guide_to_t: float, sampler: str, method: str, steps: int, seed: int,
                         progress=tracker):
        """The page's button: a bad input is a warning and a line under the grid, which stays as it was."""
        try:
            return draw((model, classes, images_per_class, guidance_scale, guide_from_t, guide_to_t, sampler,
                         method, steps, seed), progress)
        except DemoError as e:
            gr.Warning(str(e))
            return gr.skip(), gr.skip(), f"**Not drawn:** {e}. The grid shown is the last one drawn."

    with gr.Blocks(title="vit5-sit demo") as app:
        gr.Markdown("# vit5-sit: class-conditional samples\nSiT flow matching on a ViT-5 backbone. Image i "
                    "of the grid has seed SEED + i, as in `sample.py`.")
        with gr.Row():
            with gr.Column(scale=1):
                with gr.Row():
                    name = gr.Textbox(model, label="model", scale=4,
                                      info="'demo', 'demo-1step' (one network call per image), a run / "
                                      "checkpoint / model folder, or a Hub repo id"
                                      if models.allowed is None else "one of: " + ", ".join(models.allowed))
                    load_btn = gr.Button("load", scale=1)
                    one_step_btn = gr.Button("one-step demo", scale=1)
                about = gr.Markdown(first["about"])
                classes = gr.Textbox(first["classes"], label="classes",
                                     info="ids, ranges (0-9) or, for ImageNet models, names; comma-separated")
                per_class = gr.Slider(1, MAX_PER_CLASS, value=DEFAULT_PER_CLASS, step=1, label="images per class")
                guidance = gr.Slider(1.0, 10.0, value=first["guidance"], step=0.25,
                                     label="guidance scale (1 = none)")
                with gr.Row():
                    low = gr.Number(first["low"], label="guide from t", minimum=0, maximum=1)
                    high = gr.Number(first["high"], label="to t (0 noise, 1 data)", minimum=0, maximum=1)
                with gr.Row():
                    sampler = gr.Radio(["ode", "sde", "meanflow"], value=first["sampler"], label="sampler",
                                       info="meanflow: MeanFlow models only (1 step = 1 network call)")
                    method = gr.Dropdown(list(METHODS), value=first["method"], label="method")
                steps = gr.Slider(1, MAX_STEPS, value=first["steps"], step=1, label="steps")
                seed = gr.Number(0, label="seed", precision=0)
                go = gr.Button("generate", variant="primary")
            with gr.Column(scale=1):
                grid = gr.Image(label="grid", type="filepath", format="png", interactive=False)
                info = gr.Markdown()
                download = gr.File(label="download")
        inputs = [name, classes, per_class, guidance, low, high, sampler, method, steps, seed]
        # One sampler at a time for the page and the API (it takes every core); the others wait in the queue.
        # One progress bar, on the grid (on every output, a grid was drawn under three bars).
        queued = dict(concurrency_id="sampler", concurrency_limit=1, show_progress_on=[grid])
        go.click(generate_on_page, inputs, [grid, download, info], api_visibility="private", **queued)
        api = gr.Button(visible=False)  # the API's /generate: the same inputs, but an input error is an error
        # ... and inputs of its own, without the widgets' bounds: a value outside them reaches generate_grid, whose
        # message names the setting and its range, instead of Gradio's own wording from the slider's preprocess.
        api_inputs = [gr.Textbox(visible=False), gr.Textbox(visible=False), gr.Number(visible=False),
                      gr.Number(visible=False), gr.Number(visible=False), gr.Number(visible=False),
                      gr.Textbox(visible=False), gr.Textbox(visible=False), gr.Number(visible=False),
                      gr.Number(visible=False)]
        api.click(generate, api_inputs, [grid, download, info], api_name="generate", **queued)
        form = dict(show_progress="hidden")  # filling the form is quick: no bar over each of its fields
        fields = [classes, guidance, low, high, sampler, method, steps, about]  # model_defaults, in load's order
        load_btn.click(load, [name], fields, api_name="load", **form)
        # the one-step demo button fills the form, then draws its grid as "generate" would
        one_step_btn.click(fill_one_step, None, [name, *fields],
                           api_visibility="private", **form).success(
            generate_on_page, inputs, [grid, download, info], api_visibility="private", **queued)
    app.queue(max_size=max_queue, default_concurrency_limit=1)
    return app


def _allow(text: str) -> list[str] | None:
    """argparse type: comma-separated model names, or 'any' (None: no restriction)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give model names, comma-separated, or 'any'")
    if ANY in names:
        return None
    return [path_text(n) for n in names]


@stops_cleanly("interrupted: the page is stopped; nothing was written")  # while starting (the model, Gradio)
def main(argv: list[str] | None = None) -> int:
    program = Path(sys.argv[0]).name  # vit5-sit-demo (the installed command) names itself; else the -m form
    p = Parser(prog=program if program.startswith("vit5-sit-") else "python -m vit5_sit.app", command="app",
               description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=path_text, default=DEMO,
                   help="'demo' (default), a run / checkpoint / model folder or a Hub repo id OWNER/NAME[@REVISION]")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default: {DEFAULT_HOST}, this machine only; 0.0.0.0: every "
                        "address, so other machines can reach the page)")
    p.add_argument("--port", type=integer, default=DEFAULT_PORT,  # its range: contract.FLAGS["app --port"]
                   help=f"port, {MIN_PORT}-65535 (default: {DEFAULT_PORT})")
    p.add_argument("--allow", type=_allow, default=(), metavar="NAMES",
                   help="further models the page's model box may load (comma-separated folders or Hub repo ids), "
                        "or 'any'. Default: any on localhost; only --model when --host is another address")
    p.add_argument("--max-evals", type=positive_int, default=MAX_EVALS, metavar="N",
                   help=f"network evaluations one grid may take, summed over its images (a guided one counts 2; "
                        f"adaptive solvers such as dopri5 are stopped past it). Default: {MAX_EVALS:,}, "
                        f"{MAX_EVALS // DEMO_GRID_EVALS}x the demo's default grid ({DEMO_GRID_EVALS:,}: "
                        "{} digits x {} Euler steps x {}, guided)".format(*DEMO_GRID))
    p.add_argument("--max-queue", type=positive_int, default=MAX_QUEUE, metavar="N",
                   help=f"calls that may wait while one grid is drawn; more are turned away (default: {MAX_QUEUE})")
    args = p.parse_args(argv)
    local = args.host in LOCAL_HOSTS
    allowed = args.allow if args.allow != () else (None if local else [])
    try:
        import gradio  # noqa: F401
    except ImportError:
        print("error: the web demo needs Gradio: pip install 'vit5-sit[app]' (or pip install gradio)",
              file=sys.stderr)
        return 2
    try:
        app = build_app(args.model, allowed=allowed, max_evals=args.max_evals, max_queue=args.max_queue)
    except DemoError as e:
        print(f"error: --model: {e}", file=sys.stderr)
        return 2
    if not local:
        served = ("any model folder of this machine or Hub repo" if allowed is None
                  else ", ".join(dict.fromkeys([args.model, *allowed])) + " only (--allow adds others)")
        print(f"warning: listening on {args.host}: anyone who can reach this machine can use the page; "
              f"it serves {served}")
    try:
        app.launch(server_name=args.host, server_port=args.port, share=False, inbrowser=False, show_error=True,
                   ssr_mode=False)
    except OSError as e:  # the port is taken, the address is not this machine's
        print(f"error: --host {args.host} --port {args.port}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
