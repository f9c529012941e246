"""Ctrl-C that keeps finished work: one line saying where it stopped and how to continue, exit code 130.

Sampling needs nothing special: a KeyboardInterrupt may land anywhere, since finished images are written
atomically and the rest is simply drawn again. Training must not stop half-way through an optimizer or EMA
update, so `deferred_sigint` turns the first Ctrl-C into a request that the loop reads at the end of a step
(`stop_requested`); the loop then saves a checkpoint and raises `Interrupted`. A second Ctrl-C stops at once.
SIGTERM is treated the same way (`STOP_SIGNALS`), so ``kill PID`` or a scheduler's stop keeps the work too.
Until a loop first asks, Ctrl-C raises at once (there is nothing to keep yet). The other commands (sampling,
evaluation, the data and export tools) see SIGTERM as Ctrl-C (`sigterm_as_ctrl_c`), and `stops_cleanly`
turns either into one line and exit code 130 instead of a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

EXIT_CODE = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C
PIPE_CLOSED_EXIT_CODE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away (`| head`)
# SIGTERM (``kill PID``, a batch scheduler's stop or pre-emption notice) is handled like Ctrl-C: the first one
# asks the loop to stop after its step with a checkpoint, a second one stops at once.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """Stopped by Ctrl-C after keeping the finished work; ``str(e)`` is the one line to print."""


_state = {"polled": False, "requested": False}


def stop_requested() -> bool:
    """Whether Ctrl-C asked the running loop to stop at this safe point (always False without the handler)."""
    _state["polled"] = True
    return _state["requested"]


def sigint_at_default() -> None:
    """Set Ctrl-C back to its default; meant as ``preexec_fn`` of a child process that must be stoppable.

    A shell that starts a job in the background (``cmd &``, ``nohup``, CI runners) leaves SIGINT *ignored*, and
    a Python child inherits that until it installs its own handler: a stop request sent while it starts up
    would be lost. Children started with this hear the first Ctrl-C however their parent was launched.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _handler(signum, frame) -> None:
    if not _state["polled"] or _state["requested"]:  # nothing to keep yet, or the second Ctrl-C
        raise KeyboardInterrupt
    _state["requested"] = True


@contextlib.contextmanager
def deferred_sigint(enabled: bool = True) -> Iterator[None]:
    """Within this block the first Ctrl-C (or SIGTERM) is a stop request for loops that call `stop_requested`.

    Disabled (or off the main thread) it does nothing; multi-process launches leave Ctrl-C alone, since the
    processes could stop at different steps and wait for each other forever.
    """
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    # A signal the parent left ignored (``nohup``, a shell's background job for SIGINT) stays ignored.
    previous = {sig: signal.signal(sig, _handler) for sig in STOP_SIGNALS if signal.getsignal(sig) != signal.SIG_IGN}
    _state.update(polled=False, requested=False)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _state.update(polled=False, requested=False)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


STARTING = "interrupted while starting: nothing was written; run the same command again"
COMMAND_MODULES = ("vit5_sit.",)  # `python -m vit5_sit.X`: every module run so is a command
COMMAND_SCRIPTS = "vit5-sit-"     # the console scripts of pyproject.toml


def _stop_while_starting(signum, frame) -> None:
    print(STARTING, file=sys.stderr, flush=True)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    # Nothing is written yet, so there is nothing to clean up: exit at once. An exception (SystemExit, or
    # KeyboardInterrupt: a traceback) raised in the middle of torch's import could leave the interpreter's
    # shutdown waiting on a half-initialised extension (seen as a command that never exited, 1 in ~16 loaded runs).
    os._exit(EXIT_CODE)


def stop_while_starting() -> None:
    """Until a command's ``main`` takes the signals over (`sigterm_as_ctrl_c`, `deferred_sigint`), SIGTERM, and
    Ctrl-C, print `STARTING` and exit with EXIT_CODE, instead of dying silently (exit -15) or with a traceback
    while the command imports torch and its modules, which takes seconds.

    Called at a command's very start: by the package's ``__init__`` when the process is one of our commands
    (`started_as_command`), and by the scripts at the repository root. A signal that the parent left ignored
    (``nohup``, a shell's background job for SIGINT) stays ignored. Off the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        current = signal.getsignal(sig)
        if current in (signal.SIG_DFL, signal.default_int_handler):  # not SIG_IGN, nor a handler of a host
            signal.signal(sig, _stop_while_starting)


def started_as_command() -> bool:
    """Whether this process runs one of our commands: ``python -m vit5_sit.X`` (seen while the package is
    imported on the way to X, when sys.argv[0] is still '-m') or a console script ``vit5-sit-*``."""
    import os

    argv = getattr(sys, "orig_argv", [])
    if sys.argv[:1] == ["-m"] and "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1].startswith(COMMAND_MODULES)
    return bool(sys.argv) and os.path.basename(sys.argv[0]).startswith(COMMAND_SCRIPTS)


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within this block SIGTERM (``kill PID``, ``timeout``, a scheduler's stop) raises KeyboardInterrupt, as
    Ctrl-C does, so the ``except KeyboardInterrupt`` paths that keep finished work and release locks run for
    it too; Ctrl-C too, when `stop_while_starting` had taken it (an ignored one stays ignored). Off the main
    thread (where no handler can be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is _stop_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if previous_int is _stop_while_starting:
            signal.signal(signal.SIGINT, previous_int)


def _stdout_closed() -> int:
    """The reader of our output went away (``... | head``): point stdout at /dev/null, so that the flush at exit
    finds nowhere to fail, and stop quietly with the code a shell reports for a writer stopped by SIGPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout replaced by an object without a file descriptor
        pass
    return PIPE_CLOSED_EXIT_CODE


def quiet_when_piped(main: Callable[..., int | None]) -> Callable[..., int | None]:
    """Decorator for a command's ``main``: output into a closed pipe (``python -m vit5_sit.models | head``)
    ends the command quietly with exit code 141 instead of a BrokenPipeError traceback. Its output is flushed
    before it returns, so that a pipe closed while the last lines waited in the buffer is caught here too."""
    @functools.wraps(main)
    def run(*args, **kwargs) -> int | None:
        try:
            try:
                code = main(*args, **kwargs)
            except SystemExit:  # argparse's --help and usage errors: their buffered output meets the pipe here
                sys.stdout.flush()
                raise
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            return _stdout_closed()
    return run


def stops_cleanly(message: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorator for a command's ``main``: Ctrl-C or SIGTERM prints ``message`` (one line: what was kept and
    how to continue) and returns EXIT_CODE, instead of a traceback; a write the storage refuses (a full disk,
    `vit5_sit.common.checks.storage_failure`) prints ``error: ...`` with the same account of what was kept, exit 1.
    Output into a closed pipe (``| head``) stops quietly, exit code 141 (`quiet_when_piped`).
    The command's files are written atomically, so whatever it was writing is either whole or absent."""
    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        piped = quiet_when_piped(main)  # BrokenPipeError is an OSError, but no storage problem: handled first

        @functools.wraps(main)
        def run(*args, **kwargs) -> int:
            try:
                with sigterm_as_ctrl_c():
                    return piped(*args, **kwargs)
            except KeyboardInterrupt:
                print(message, file=sys.stderr, flush=True)
                return EXIT_CODE
            except Interrupted as e:  # stopped inside a loop that kept its work and says where (mass sampling)
                print(e, file=sys.stderr, flush=True)
                return EXIT_CODE
            except (ImportError, RuntimeError, OSError) as e:
                from vit5_sit.common.versions import mismatch

                line = mismatch(e)  # torchvision built for another torch: one line naming the fix
                if line is not None:
                    print(f"error: {line}", file=sys.stderr, flush=True)
                    return 1
                if not isinstance(e, OSError):
                    raise
                from vit5_sit.common.checks import storage_failure  # a full disk, a read-only folder: one line

                return storage_failure(e, message.removeprefix("interrupted: "))
        return run
    return wrap
