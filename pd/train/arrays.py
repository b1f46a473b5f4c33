"""Arrays on disk, each `.npz` beside a `.json` holding its sha256: the trained decomposition
(stacked V/U and CI parameters, read back into a known structure) and the frozen target's
parameters (nested dicts, self-describing, with the fingerprint `pd.load` compares).

In a multi-process run every process calls `save` / `save_frozen` (arrays spanning processes
are gathered, a collective), process 0 alone writes, and all return once the files exist."""

import hashlib
import io
import json
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jaxtyping import PyTree

from pd.ci import GroupParams
from pd.files import write_atomic
from pd.state import Components

Trained = tuple[Components, GroupParams]
# Frozen parameters up to this size are copied into the run folder (toys, small models); a
# larger target (a real language model) is identified by its fingerprint and rebuilt on load.
FROZEN_COPY_LIMIT = 64 * 2**20


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **arrays)
    return buf.getvalue()


def _verified(path: Path, what: str) -> tuple[bytes, dict[str, object]]:
    """The payload of `path` and its `.json`, or why they cannot be trusted."""
    if not path.exists():
        raise FileNotFoundError(f"{what} '{path}' does not exist, expected a pd {what}")
    payload = path.read_bytes()
    meta_path = path.with_suffix(".json")
    try:
        meta = json.loads(meta_path.read_text())
        expected = meta["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{what} metadata '{meta_path}' is unreadable ({err})") from None
    if hashlib.sha256(payload).hexdigest() != expected:
        raise ValueError(f"{what} '{path}' is corrupt: its sha256 does not match '{meta_path}'")
    return payload, meta


def _arrays(path: Path, payload: bytes, what: str) -> dict[str, np.ndarray]:
    """The arrays of `path`'s `.npz` payload, or one sentence saying the file is damaged."""
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as z:
            return {key: z[key] for key in z.files}
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, TypeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(
            f"{what} '{path}' is damaged or not a pd file ({reason}), expected the .npz archive "
            "pd wrote"
        ) from None


def _array(arrays: dict[str, np.ndarray], key: str, path: Path, what: str) -> np.ndarray:
    if key not in arrays:
        raise ValueError(f"{what} '{path}' lacks array '{key}', expected the arrays pd wrote")
    return arrays[key]


def host_arrays(tree: PyTree) -> PyTree[np.ndarray]:
    """`tree` with every leaf's whole value as a numpy array, also in a multi-process run: the
    leaves with shards on other processes are gathered there in one collective (every process
    calls this with the same structure)."""
    leaves, treedef = jax.tree.flatten(tree)
    host: list[object] = list(leaves)
    spread = []
    for i, a in enumerate(leaves):
        if isinstance(a, jax.Array) and not a.is_fully_addressable:
            if a.is_fully_replicated:  # every process holds all of it
                host[i] = a.addressable_data(0)
            else:
                spread.append(i)
    if spread:
        allgather: Callable[..., list[object]] = multihost_utils.process_allgather  # unannotated
        wholes = allgather([leaves[i] for i in spread], tiled=True)
        for i, whole in zip(spread, wholes, strict=True):
            host[i] = whole
    arrays: PyTree[np.ndarray] = jax.tree.unflatten(treedef, [np.asarray(a) for a in host])
    return arrays


def _written(path: Path) -> None:
    """Every process waits here until process 0 has written `path`."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"pd.train.arrays wrote {path.name}")


def save(path: Path, trained: Trained) -> None:
    """Write leaves by their tree path, plus a `.json` with the payload's sha256."""
    leaves = jax.tree_util.tree_flatten_with_path(host_arrays(trained))[0]
    if jax.process_index() == 0:
        payload = _npz({jax.tree_util.keystr(p): v for p, v in leaves})
        write_atomic(path, payload)
        meta = {"sha256": hashlib.sha256(payload).hexdigest()}
        write_atomic(path.with_suffix(".json"), json.dumps(meta).encode())
    _written(path)


def load(path: Path, like: PyTree[jax.ShapeDtypeStruct]) -> Trained:
    """The saved decomposition in the abstract structure `like` (shapes checked), or why not."""
    payload, _ = _verified(path, "checkpoint")
    arrays = _arrays(path, payload, "checkpoint")
    paths, treedef = jax.tree_util.tree_flatten_with_path(like)
    leaves = []
    for p, ref in paths:
        key = jax.tree_util.keystr(p)
        value = _array(arrays, key, path, "checkpoint")
        if value.shape != ref.shape:
            raise ValueError(
                f"checkpoint '{path}' array '{key}' has shape {value.shape}, expected {ref.shape}"
            )
        leaves.append(jnp.asarray(value))
    restored: Trained = jax.tree_util.tree_unflatten(treedef, leaves)
    return restored


def _dict_keys(path: tuple[object, ...]) -> list[str]:
    keys = [getattr(k, "key", None) for k in path]
    if not all(isinstance(k, str) for k in keys):
        raise TypeError(f"parameter path {jax.tree_util.keystr(path)} is not made of dict keys")
    return [str(k) for k in keys]


def _host_leaves(params: hk.Params) -> list[tuple[list[str], np.ndarray]]:
    leaves = jax.tree_util.tree_flatten_with_path(host_arrays(params))[0]
    return sorted(((_dict_keys(p), v) for p, v in leaves), key=lambda kv: kv[0])


def fingerprint(params: hk.Params) -> str:
    """The sha256 of the parameters' paths, dtypes, shapes and bytes: equal for equal weights,
    however they were loaded."""
    return _fingerprint(_host_leaves(params))


def _fingerprint(leaves: list[tuple[list[str], np.ndarray]]) -> str:
    digest = hashlib.sha256()
    for keys, value in leaves:
        digest.update(json.dumps([keys, str(value.dtype), list(value.shape)]).encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


def save_frozen(path: Path, params: hk.Params) -> None:
    """`path` (`.npz`, arrays `0, 1, …`) and its `.json` (their dict paths, the fingerprint);
    over FROZEN_COPY_LIMIT, the `.json` alone, with the fingerprint."""
    leaves = _host_leaves(params)
    meta: dict[str, object] = {"fingerprint": _fingerprint(leaves)}
    if jax.process_index() == 0:
        if sum(v.nbytes for _, v in leaves) <= FROZEN_COPY_LIMIT:
            payload = _npz({str(i): v for i, (_, v) in enumerate(leaves)})
            write_atomic(path, payload)
            meta |= {"sha256": hashlib.sha256(payload).hexdigest(), "paths": [k for k, _ in leaves]}
        write_atomic(path.with_suffix(".json"), json.dumps(meta).encode())
    _written(path)


def load_frozen(path: Path) -> tuple[str, hk.Params | None]:
    """The recorded fingerprint, and the parameters where the run folder holds a copy."""
    if not path.exists():
        meta_path = path.with_suffix(".json")
        try:
            return str(json.loads(meta_path.read_text())["fingerprint"]), None
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"frozen-target record '{meta_path}' is unreadable ({err})") from None
    what = "frozen-target file"
    payload, meta = _verified(path, what)
    arrays = _arrays(path, payload, what)
    params: dict[str, dict[str, jax.Array]] = {}
    for i, (module, name) in enumerate(_param_paths(meta.get("paths"))):
        params.setdefault(module, {})[name] = jnp.asarray(_array(arrays, str(i), path, what))
    return str(meta["fingerprint"]), params


def _param_paths(paths: object) -> list[tuple[str, str]]:
    """`[[module, name], …]` as written by `save_frozen` (haiku's two-level parameters)."""
    if not isinstance(paths, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(k, str) for k in p) for p in paths
    ):
        raise ValueError(f"frozen-target paths {paths!r:.80} are not [module, name] pairs")
    return [(module, name) for module, name in paths]
