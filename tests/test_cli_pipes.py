"""Every CLI answers --help at once (torch is imported only after the arguments are parsed) and stops quietly
when the reader of its output goes away (`... | head`): no BrokenPipeError traceback, exit code 141."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vit5_sit.common.interrupt import PIPE_CLOSED_EXIT_CODE, quiet_when_piped, stops_cleanly

ROOT = Path(__file__).resolve().parent.parent
FAST_HELP = [["sample.py"], ["train.py"], ["eval_fid.py"], ["-m", "vit5_sit.models"], ["-m", "vit5_sit.demo"],
             ["-m", "vit5_sit.study"], ["-m", "vit5_sit.data"], ["-m", "vit5_sit.demo.digit_classifier"],
             ["-m", "vit5_sit.repa.classifier"]]


def _imported(stderr: str) -> set[str]:
    """Module names from `python -X importtime` (lines 'import time: self | cumulative | name')."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("cli", FAST_HELP, ids=" ".join)
def test_help_does_not_import_torch(cli):
    result = subprocess.run([sys.executable, "-X", "importtime", *cli, "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and "usage:" in result.stdout
    modules = _imported(result.stderr)
    assert "argparse" in modules  # the import log was read
    assert "torch" not in modules, f"{' '.join(cli)} --help imports torch"


def test_the_data_cli_choices_written_out_for_a_fast_help_match_the_modules_they_mirror():
    import torch

    from vit5_sit.data import __main__ as data_cli
    from vit5_sit.data.latents import SAVE_DTYPES
    from vit5_sit.data.vae import DEFAULT_VAE

    assert data_cli.DEFAULT_VAE == DEFAULT_VAE and sorted(data_cli.DTYPES) == sorted(SAVE_DTYPES)
    assert all(isinstance(getattr(torch, name), torch.dtype) for name in data_cli.DTYPES)


def test_lazy_package_names_still_import():
    """The names that moved behind PEP 562 look-ups (for a fast --help) are still there, the same objects."""
    import vit5_sit.data
    import vit5_sit.repa
    from vit5_sit.data import images, vae
    from vit5_sit.demo import digit_classifier, digit_net
    from vit5_sit.repa import align, classifier, classifier_net

    assert vit5_sit.data.ImageFolderDataset is images.ImageFolderDataset and vit5_sit.data.load_vae is vae.load_vae
    assert vit5_sit.repa.Alignment is align.Alignment and "load_encoder" in dir(vit5_sit.repa)
    assert digit_classifier.classify is digit_net.classify and classifier.Classifier is classifier_net.Classifier
    for module, missing in ((vit5_sit.data, "nope"), (digit_classifier, "nope"), (classifier, "nope")):
        with pytest.raises(AttributeError, match="has no attribute 'nope'"):
            getattr(module, missing)


def _into_closed_pipe(cmd: list[str]) -> subprocess.CompletedProcess:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    try:
        return subprocess.run([sys.executable, *cmd], cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    finally:
        os.close(write)


def test_models_listing_into_a_closed_pipe_is_quiet():
    result = _into_closed_pipe(["-m", "vit5_sit.models"])
    assert result.returncode == PIPE_CLOSED_EXIT_CODE and result.stderr == ""


@pytest.mark.parametrize("cli", [["sample.py"], ["-m", "vit5_sit.demo"]], ids=" ".join)
def test_help_into_a_closed_pipe_is_quiet(cli):
    result = _into_closed_pipe([*cli, "--help"])
    assert result.returncode in (0, PIPE_CLOSED_EXIT_CODE) and result.stderr == ""


def _writes_into_closed_pipe() -> int:
    raise BrokenPipeError(32, "Broken pipe")


def test_both_decorators_turn_a_broken_pipe_into_exit_code_141(capsys):
    assert quiet_when_piped(_writes_into_closed_pipe)() == PIPE_CLOSED_EXIT_CODE
    # stops_cleanly turns other OSErrors into a storage error: a closed pipe must not read as a full disk
    assert stops_cleanly("interrupted")(_writes_into_closed_pipe)() == PIPE_CLOSED_EXIT_CODE
    assert capsys.readouterr().err == ""


def test_other_os_errors_still_reach_the_storage_message(capsys):
    def disk_full() -> int:
        raise OSError(28, "No space left on device")

    assert stops_cleanly("interrupted: nothing kept")(disk_full)() == 1
    assert "No space left on device" in capsys.readouterr().err
