"""Multi-arm, multi-seed ablation studies (`python -m vit5_sit.study`): spec, runner, report; figures (a cell of a
study.json, as pages quote it)."""

from .report import aggregate, component_deltas, decide, mean_sd, sampling_noise, write_report
from .runner import evaluate_all, status, train_all
from .spec import Arm, DecisionSpec, EvalSpec, StudyError, StudySpec, load_study

__all__ = ["Arm", "DecisionSpec", "EvalSpec", "StudyError", "StudySpec", "aggregate", "component_deltas",
           "decide", "evaluate_all",
           "load_study", "mean_sd", "sampling_noise", "status", "train_all", "write_report"]
