"""`python train.py`: runs vit5_sit/cli/train.py (installed as `vit5-sit-train`); `--help` lists the flags."""
import sys

from vit5_sit.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
