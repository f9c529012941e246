"""`python train.py`: runs vit5_sit/cli/train.py (installed as `vit5-sit-train`); `--help` lists the flags."""
import sys

from vit5_sit.common.interrupt import stop_while_starting

if __name__ == "__main__":
    stop_while_starting()  # before the imports below (torch: seconds): SIGTERM then is one line and exit 130
from vit5_sit.cli.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
