"""The Hugging Face Hub and model folders: from_pretrained / save_pretrained / push_to_hub, the model card,
finding and checking model files. Imports the models, config and shared plumbing.

The old names (`from vit5_sit.hub import from_pretrained`) keep working: they are looked up in `api`."""


import importlib


def __getattr__(name: str):
    return getattr(importlib.import_module("vit5_sit.hub.api"), name)
