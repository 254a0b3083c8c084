"""XLA's options for the processes that compile many small programs and run each briefly
(verification, benchmarks): LLVM at -O1 compiles them in about half the time (the CartPole
verifier's L1: 6.5 s of compiling instead of 11 s), and train.py builds its update at -O1 too."""
from __future__ import annotations

import os
from typing import MutableMapping

LEVEL_OPTION = "xla_backend_optimization_level"


def compile_quickly(environ: MutableMapping[str, str] = os.environ) -> None:
    """Ask XLA for -O1 unless XLA_FLAGS already sets a level. XLA reads its flags once, when JAX
    starts its first backend, so this runs before anything is compiled."""
    flags = environ.get("XLA_FLAGS", "")
    if LEVEL_OPTION not in flags:
        environ["XLA_FLAGS"] = f"{flags} --{LEVEL_OPTION}=1".strip()
