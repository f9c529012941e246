"""`python -m vit5_sit.demo export RUN`: export a trained run as the bundled demo model."""

import sys

from vit5_sit.demo.export import main

sys.exit(main())
