"""How a command that computes runs: its CPU threads, and its place among the harness
processes working on this machine (:mod:`harness.foundation.threads`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """``--threads N`` of the commands that compute."""
    parser.add_argument(
        "--threads", type=int, metavar="N",
        help="CPU threads to compute with (default: $IDRS_BENCH_THREADS, else $OMP_NUM_THREADS, "
        "else the cores divided among the idrs-bench processes working on this machine; a "
        "run resumed or shared keeps the count it began with)",
    )  # fmt: skip


@contextmanager
def working(requested: int | None, quiet: bool) -> Iterator[None]:
    """This process registered as working on this machine, computing with ``requested``
    threads or its share of the cores (:mod:`harness.foundation.threads`)."""
    import torch

    from harness.foundation.threads import (
        WorkingProcess,
        available_cores,
        thread_count,
        working_processes,
    )

    with WorkingProcess():
        cores, working = available_cores(), working_processes()
        threads = thread_count(cores, working, requested)
        torch.set_num_threads(threads)
        if working > 1 and requested is None and not quiet:
            Console(stderr=True, soft_wrap=True).print(
                f"note: {working} idrs-bench processes work on this machine ({cores} cores): "
                f"this one computes with {threads} thread(s), a run it resumes or audits with "
                "the count the run began with (--threads sets it)",
                highlight=False,
            )
        yield
