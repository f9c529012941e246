"""`python -m vit5_sit.demo export RUN --out FOLDER`: export a trained run as a model folder (the bundled demo's
layout, with diffusers' beside it)."""

import sys

from vit5_sit.demo.export import main

sys.exit(main())
