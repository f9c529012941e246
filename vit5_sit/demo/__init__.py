"""The demo: the bundled MNIST model's export, its digit classifier (the accuracy judge) and the browser
page. The top of the package: it may import anything below it.

`vit5_sit.demo.main` / `export_model` (the old module) are looked up in `export`."""

import importlib


def __getattr__(name: str):
    return getattr(importlib.import_module("vit5_sit.demo.export"), name)
