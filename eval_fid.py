"""`python eval_fid.py`: runs vit5_sit/cli/eval_fid.py (installed as `vit5-sit-eval`); `--help` lists the flags."""
import sys

from vit5_sit.cli.eval_fid import main

if __name__ == "__main__":
    sys.exit(main())
