"""Per-device memory of the production step (`llama8b_full`'s `train_step`) on simulated CPU
devices, from XLA's own `compiled.memory_analysis()`: compile only, nothing is allocated.

    python bench/memory.py [--devices 8,32] [--layers 4,32] [--set KEY=VALUE ...]

One line per (devices, layers): `devices=D layers=L args_gib=… temp_gib=… peak_gib=…`, where
peak = arguments + outputs − aliased (donated buffers reused for outputs) + temporaries. The
mesh is `data = D`, `model = 1`, one sequence per device (`train.batch = D`), as the preset.
"""

import argparse
import os
import sys
from collections.abc import Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", default="8,32")
    parser.add_argument("--layers", default="4,32")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config override"
    )
    args = parser.parse_args()
    devices = [int(v) for v in args.devices.split(",")]
    layers = [int(v) for v in args.layers.split(",")]
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={max(devices)}"
    )
    import jax

    from pd.train.compile_only import compile_programs, memory
    from pd.train.config import load_config

    clear_caches: Callable[[], None] = jax.clear_caches  # unannotated upstream
    gib = 2.0**30
    for d in devices:
        for n in layers:
            clear_caches()
            overrides = [f"mesh.data={d}", f"train.batch={d}", f"eval.batch={d}"]
            overrides += [f"target.n_layers={n}", *args.set]
            _, compiled = compile_programs(load_config("llama8b_full", overrides))
            m = memory(compiled["train_step"])
            if m is None:
                sys.exit("XLA gave no memory analysis for train_step on this backend")
            print(
                f"devices={d} layers={n} args_gib={m.arguments / gib:.1f} "
                f"out_gib={m.outputs / gib:.1f} aliased_gib={m.aliased / gib:.1f} "
                f"temp_gib={m.temporaries / gib:.1f} peak_gib={m.peak / gib:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
