"""One worker of the multi-process test: sharded init and one train step of a tiny ResidMLP
whose every trained leaf (V/U, CI weights, their Adam moments) is split over both processes,
then the state saved with orbax from every process, restored and compared, and the
decomposition written by `pd.train.arrays.save`.

python tests/multiprocess_worker.py OUT.npz PROCESS_ID NUM_PROCESSES PORT DEVICES_PER_PROCESS

Beside OUT.npz (written by process 0: a few gathered arrays, and the whole state after the step
as `state<path>`): OUT.ckpt (the orbax checkpoints) and OUT.decomposition.npz.
"""

import sys
from collections.abc import Callable
from pathlib import Path

import jax

OVERRIDES = ["C=4", "train.batch=16", "target.n_features=8", "target.d_embed=8", "target.d_mlp=4"]

set_option: Callable[[str, object], None] = jax.config.update  # unannotated upstream


def main(out: str, process_id: int, num_processes: int, port: int, local_devices: int) -> None:
    set_option("jax_num_cpu_devices", local_devices)
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import AxisType, Mesh

    from pd.init import key_tree
    from pd.shard import global_batch, initialize_distributed
    from pd.shard.state import frozen_shardings
    from pd.train.arrays import host_arrays
    from pd.train.arrays import save as save_decomposition
    from pd.train.checkpoints import Checkpoints
    from pd.train.config import load_config
    from pd.train.init_state import abstract_state, init_train_state, state_shardings
    from pd.train.kinds import as_toy
    from pd.train.run import make_recipe
    from pd.train.step import make_sampler, make_train_step

    if num_processes > 1:
        initialize_distributed(f"127.0.0.1:{port}", num_processes, process_id)
    # (data, model) = (2, 2) with the model axis across the processes (devices 0, 1 are
    # process 0's): each process holds both data shards of the batch, not half of its rows.
    devices = np.asarray(jax.devices()).reshape(2, 2).T
    mesh = Mesh(devices, ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
    recipe = make_recipe(load_config("resid_mlp1", OVERRIDES))
    init_key, src_key, run_key = key_tree(0)
    toy = as_toy(recipe.target)
    frozen = toy.expand(toy.init_train(jax.random.key(1)))
    frozen = jax.device_put(frozen, frozen_shardings(recipe.target, frozen, mesh))
    state = init_train_state(recipe, init_key, src_key, mesh)
    allgather: Callable[..., object] = multihost_utils.process_allgather

    def gather(x: object) -> object:
        return allgather(x, tiled=True)  # the global array, on every host

    arrays = {"init_V0": gather(state.components.V[0])}  # before the step donates its state
    x = global_batch(make_sampler(as_toy(recipe.target), 16)(run_key, state.step), mesh)
    step = make_train_step(recipe, state_shardings(recipe, mesh))
    state, metrics = step(state, frozen, x, run_key)
    arrays["V0"] = gather(state.components.V[0])
    arrays["U1"] = gather(state.components.U[1])
    arrays["loss"] = gather(metrics["loss/total"])

    # Issue 11: every process saves its shards into one shared folder; the restore places each
    # leaf as a run on this mesh would and equals the saved state.
    def spans(a: jax.Array) -> bool:  # shards on both processes
        return num_processes == 1 or not a.is_fully_addressable

    learned = (state.components, state.ci_params, state.opt_components, state.opt_ci)
    for path, leaf in jax.tree_util.tree_flatten_with_path(learned)[0]:
        if leaf.ndim:  # (not the optimizers' step counts)
            assert spans(leaf), f"{jax.tree_util.keystr(path)} is whole on one process"
    saved = host_arrays(state)  # the whole state, gathered on every process
    folder = Path(out).with_suffix(".ckpt")
    checkpoints = Checkpoints(folder, keep=1)
    checkpoints.save(1, state)
    checkpoints.close()  # waits for the asynchronous write
    checkpoints = Checkpoints(folder, keep=1)
    like = abstract_state(recipe, state_shardings(recipe, mesh))
    restored = checkpoints.restore_latest(like)
    checkpoints.close()
    assert restored is not None and int(restored.step) == 1
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(like), strict=True):
        assert got.sharding.is_equivalent_to(want.sharding, got.ndim), (got.sharding, want)
    assert spans(restored.components.V[0])
    jax.tree.map(np.testing.assert_array_equal, host_arrays(restored), saved)

    # The decomposition file: gathered on every process, written by process 0.
    trained = (restored.components, restored.ci_params)
    save_decomposition(Path(out).with_suffix(".decomposition.npz"), trained)
    if process_id == 0:
        paths = jax.tree_util.tree_flatten_with_path(saved)[0]
        arrays |= {f"state{jax.tree_util.keystr(p)}": v for p, v in paths}
        np.savez(out, allow_pickle=False, **{k: np.asarray(v) for k, v in arrays.items()})


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
