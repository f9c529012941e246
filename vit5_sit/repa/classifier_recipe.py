"""The REPA classifier-encoder's recipe: its file format tag, the model it is and its test split. No torch
here, so the CLI (`repa.classifier`) reads it before parsing and the network (`classifier_net`) without importing
the CLI."""

FORMAT = "vit5-sit-encoder/1"
DEFAULT_PRESET = "ViT5-T/4"
DEFAULT_OVERRIDES = dict(layer_scale_init=None, learn_sigma=False, class_dropout_prob=0.0, num_classes=1)
HELD_OUT_EVERY = 10  # every 10th image is the test split
