"""The Heun end-point experiment (benchmarks/bench_heun_endpoint.py): its 'Euler last' variant is Heun on every
step but the last, and never calls the network at the grid's end (t = 1), the point of the experiment."""

import importlib.util
from pathlib import Path

import numpy as np
import torch

from vit5_sit.transport import SamplerConfig, Transport, TransportConfig
from vit5_sit.transport.samplers import ode_euler, ode_heun, steps_grid

SPEC = importlib.util.spec_from_file_location("bench_heun_endpoint", Path(__file__).parents[1] / "benchmarks" /
                                              "bench_heun_endpoint.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def test_euler_last_is_heun_then_one_euler_step_without_a_call_at_the_end():
    transport = Transport(TransportConfig())
    cfg = SamplerConfig(method="heun", steps=5)
    times = []

    def model(x, t, y):  # a velocity that depends on x and t, so the variants differ
        times.append(float(t[0]))
        return torch.sin(3 * x) * (1 + t.view(-1, 1, 1, 1))

    x0, y = torch.randn(2, 1, 4, 4), torch.zeros(2, dtype=torch.long)
    out = bench.heun_euler_last(model, x0.clone(), y, transport, cfg)
    grid = steps_grid(transport, cfg)
    assert len(times) == 2 * cfg.steps - 1 and max(times) < grid[-1] and min(times) == grid[0]
    times.clear()
    heun_part = ode_heun(model, x0.clone(), y, transport, cfg, t_steps=grid[:-1])
    last = ode_euler(model, heun_part, y, transport, cfg, t_steps=grid[-2:])
    torch.testing.assert_close(out, last)
    full = ode_heun(model, x0.clone(), y, transport, cfg)
    assert not torch.allclose(out, full)  # the full Heun's last corrector does change the result
    assert max(times) == grid[-1]         # ... and it is the one call at t = 1


def test_background_stats_of_uint8_images():
    images = np.zeros((2, 4, 4), np.uint8)
    images[0, 0, :] = 10   # 4 of 32 pixels not dark, level 10 among the < 64 ones
    images[1, 1, 0] = 200  # bright: outside the background level
    dark, level = bench.background_stats(images)
    assert dark == 27 / 32 and level == 40 / 31
