"""The digit classifier's recipe: where its weights live and how it is trained. No torch here, so the CLI
(`digit_classifier`) reads it before parsing and the network (`digit_net`) without importing the CLI."""

from pathlib import Path

CLASSIFIER = Path(__file__).parent.parent / "assets" / "digit_classifier"
RESOLUTION = 32        # the demo model's image size; digits are padded 28 -> 32 like the training export
HELD_OUT_PER_CLASS = 50
EPOCHS = 20
BATCH_SIZE = 64
LR = 2e-3
MAX_SHIFT = 2          # pixels of random translation in training
