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

    from pd.train.compile_only import compile_programs
    from pd.train.config import load_config

    clear_caches: Callable[[], None] = jax.clear_caches  # unannotated upstream
    gib = 2.0**30
    for d in devices:
        for n in layers:
            clear_caches()
            overrides = [f"mesh.data={d}", f"train.batch={d}", f"eval.batch={d}"]
            overrides += [f"target.n_layers={n}", *args.set]
            _, compiled = compile_programs(load_config("llama8b_full", overrides))
            m = compiled["train_step"].memory_analysis()
            if m is None:
                sys.exit("XLA gave no memory analysis for train_step on this backend")
            args_b, out_b = m.argument_size_in_bytes, m.output_size_in_bytes
            alias_b, temp_b = m.alias_size_in_bytes, m.temp_size_in_bytes
            peak = args_b + out_b - alias_b + temp_b
            print(
                f"devices={d} layers={n} args_gib={args_b / gib:.1f} out_gib={out_b / gib:.1f} "
                f"aliased_gib={alias_b / gib:.1f} temp_gib={temp_b / gib:.1f} "
                f"peak_gib={peak / gib:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
