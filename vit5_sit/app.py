"""`python -m vit5_sit.app`: the browser demo, kept at its old address; the page lives in
`vit5_sit.demo.app`."""

import sys

from vit5_sit.demo.app import *  # noqa: F403
from vit5_sit.demo.app import main

if __name__ == "__main__":
    sys.exit(main())
