"""`python sample.py`: runs vit5_sit/cli/sample.py (installed as `vit5-sit-sample`); `--help` lists the flags."""
import sys

from vit5_sit.cli.sample import main

if __name__ == "__main__":
    sys.exit(main())
