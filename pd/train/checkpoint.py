"""The trained decomposition on disk: stacked V/U and CI parameters in one checksummed `.npz`."""

import hashlib
import io
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PyTree

from pd.ci import GroupParams
from pd.state import Components

Trained = tuple[Components, GroupParams]


def save(path: Path, trained: Trained) -> None:
    """Write leaves by their tree path, plus a `.json` with the payload's sha256."""
    leaves = jax.tree_util.tree_flatten_with_path(jax.device_get(trained))[0]
    arrays = {jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves}
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **arrays)
    payload = buf.getvalue()
    path.write_bytes(payload)
    path.with_suffix(".json").write_text(
        json.dumps({"sha256": hashlib.sha256(payload).hexdigest()})
    )


def load(path: Path, like: PyTree[jax.ShapeDtypeStruct]) -> Trained:
    """The saved decomposition in the abstract structure `like` (shapes checked), or why not."""
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint '{path}' does not exist, expected a saved decomposition"
        )
    payload = path.read_bytes()
    meta_path = path.with_suffix(".json")
    try:
        expected = json.loads(meta_path.read_text())["sha256"]
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"checkpoint metadata '{meta_path}' is unreadable ({err})") from None
    if hashlib.sha256(payload).hexdigest() != expected:
        raise ValueError(f"checkpoint '{path}' is corrupt: its sha256 does not match '{meta_path}'")
    paths, treedef = jax.tree_util.tree_flatten_with_path(like)
    with np.load(io.BytesIO(payload)) as z:
        leaves = []
        for p, ref in paths:
            key = jax.tree_util.keystr(p)
            if key not in z.files:
                raise ValueError(f"checkpoint '{path}' lacks array '{key}'")
            value = z[key]
            if value.shape != ref.shape:
                raise ValueError(
                    f"checkpoint '{path}' array '{key}' has shape {value.shape}, "
                    f"expected {ref.shape}"
                )
            leaves.append(jnp.asarray(value))
    restored: Trained = jax.tree_util.tree_unflatten(treedef, leaves)
    return restored
