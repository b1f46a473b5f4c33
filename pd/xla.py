"""The XLA compile options of pd's step programs, in one place.

On a CPU, XLA hands reductions to YNNPACK by default. The CI networks' per-subcomponent layers
reduce `[B, C, hidden]` arrays over the batch (weight gradients) and over the hidden units, and
YNNPACK's fused reductions took 3–8× longer there than XLA's own loops; dots stay with YNNPACK
(bench/profile_step.py, README "Where a step's time goes").
"""

import jax

_CPU = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def compiler_options() -> dict[str, str]:
    """`jax.jit(..., compiler_options=...)` for a program on the default backend."""
    return dict(_CPU) if jax.default_backend() == "cpu" else {}
