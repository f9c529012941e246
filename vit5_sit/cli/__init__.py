"""The command-line programs: `python sample.py` / `vit5-sit-sample`, `python train.py` / `vit5-sit-train`,
`python eval_fid.py` / `vit5-sit-eval`. Each module's ``main(argv)`` returns the exit code; the scripts at
the repository root and the console entry points in pyproject.toml only call it."""
