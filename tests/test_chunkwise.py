"""§4.1: the chunkwise-transformer CI function — homogeneity, S27, I1 (also as a property over
chunk counts, sizes and sharded placements, §10/§11) and scan = per-chunk."""

from collections.abc import Callable
from functools import cache, partial

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding

from pd.ci import GroupParams
from pd.ci.chunkwise import Chunk, ChunkwiseTransformer
from pd.shard import ShardingError, make_mesh
from pd.shard.ci import ci_param_shardings


def _ci(
    n_chunks: int = 3, d_model: int = 16, n_blocks: int = 2, n_heads: int = 2, mlp_hidden: int = 32
) -> ChunkwiseTransformer:
    chunks = tuple(
        Chunk(layers=(i,), sites=(f"layers.{i}.q", f"layers.{i}.up")) for i in range(n_chunks)
    )
    return ChunkwiseTransformer(
        chunks=chunks,
        d_resid=8,
        site_C=tuple(
            (s, C)
            for i in range(n_chunks)
            for s, C in ((f"layers.{i}.q", 5), (f"layers.{i}.up", 7))
        ),
        d_model=d_model,
        n_blocks=n_blocks,
        n_heads=n_heads,
        mlp_hidden=mlp_hidden,
    )


# I1's two sides, jitted with the transformer static and the key traced: the vmapped init, and
# one chunk's init, which the unrolled reference calls in a Python loop over chunks. The chunk's
# program depends on its shape only (`_ci(1, …)`), so it compiles once per size for every chunk
# count.
@partial(jax.jit, static_argnums=0)
def _batched_init(ct: ChunkwiseTransformer, key: jax.Array) -> GroupParams:
    return ct.init(key)


@partial(jax.jit, static_argnums=0)
def _chunk_init(one_chunk: ChunkwiseTransformer, key: jax.Array) -> hk.Params:
    return one_chunk.net().init(key, jnp.zeros((1, 1, one_chunk.input_dim), jnp.float32))


def _unrolled_init(ct: ChunkwiseTransformer, key: jax.Array) -> GroupParams:
    """Chunk i from `fold_in(key, i)`, one call per chunk, then stacked."""
    one = _ci(1, ct.d_model, ct.n_blocks, ct.n_heads, ct.mlp_hidden)
    per_chunk = [_chunk_init(one, jax.random.fold_in(key, i)) for i in range(len(ct.chunks))]
    stacked: GroupParams = (jax.tree.map(lambda *xs: np.stack(xs), *per_chunk),)
    return stacked


@cache
def _sharded_init(
    ct: ChunkwiseTransformer, model: int
) -> Callable[[ChunkwiseTransformer, jax.Array], GroupParams]:
    """The vmapped init placed by `out_shardings` on a (data, model) mesh of the 4 devices."""
    shardings = ci_param_shardings(ct, make_mesh({"data": 4 // model, "model": model}))
    init: Callable[[ChunkwiseTransformer, jax.Array], GroupParams] = jax.jit(
        ChunkwiseTransformer.init, static_argnums=0, out_shardings=shardings
    )
    return init


def test_chunks_must_be_homogeneous() -> None:
    ci = _ci()
    swapped = (ci.chunks[0], Chunk(layers=(1,), sites=("layers.1.up", "layers.1.q")))
    with pytest.raises(ValueError, match="per-slot C tuples"):
        ChunkwiseTransformer(swapped, ci.d_resid, ci.site_C, 16, 2, 2, 32)
    wide = (ci.chunks[0], Chunk(layers=(1, 2), sites=ci.chunks[1].sites))
    with pytest.raises(ValueError, match="input widths"):
        ChunkwiseTransformer(wide, ci.d_resid, ci.site_C, 16, 2, 2, 32)


def test_s27_rope_frequencies_are_not_parameters_and_init_scales() -> None:
    params = _batched_init(_ci(), jax.random.key(0))[0]
    names = {f"{m}/{n}" for m, p in params.items() for n in p}
    assert not any("freq" in n or "rope" in n for n in names)
    leaves = {f"{m}/{n}": v for m, p in params.items() for n, v in p.items()}
    assert all(v.shape[0] == 3 for v in leaves.values())  # stacked on the chunk axis
    assert float(jnp.abs(leaves["~/w_out_b"]).max()) == 0.0
    q = leaves["block_0/q"]
    assert float(jnp.abs(q).max()) <= 1 / np.sqrt(16)


def test_i1_vmapped_init_equals_unrolled_chunks() -> None:
    ci = _ci()
    key = jax.random.key(7)
    batched = _batched_init(ci, key)[0]
    for i in range(len(ci.chunks)):
        ref = _chunk_init(_ci(1), jax.random.fold_in(key, i))
        for a, b in zip(jax.tree.leaves(batched), jax.tree.leaves(ref), strict=True):
            np.testing.assert_array_equal(np.asarray(a[i]), np.asarray(b))


def test_scan_over_chunks_equals_each_chunk_alone() -> None:
    ci = _ci()
    params = _batched_init(ci, jax.random.key(1))
    resid = jax.random.normal(jax.random.key(10), (4, 2, 6, 8))  # 3 layers + the final stream
    per_slot = jax.jit(ci.apply)(params, resid)
    assert [v.shape for v in per_slot] == [(3, 2, 6, 5), (3, 2, 6, 7)]
    net = ci.net()
    for i, chunk in enumerate(ci.chunks):
        chunk_params = jax.tree.map(lambda a, i=i: a[i], params[0])
        h = resid[chunk.layers[0]]
        h = h / jnp.sqrt(jnp.mean(h * h, axis=-1, keepdims=True) + np.finfo(np.float32).eps)
        ref = net.apply(chunk_params, h)
        for j in range(len(chunk.sites)):
            np.testing.assert_allclose(np.asarray(per_slot[j][i]), np.asarray(ref[j]), atol=1e-5)


def test_two_layers_per_chunk_read_both_streams_in_order() -> None:
    """A chunk of layers (0, 1) reads rms_norm(resid[0]) ‖ rms_norm(resid[1]), concatenated."""
    ct = ChunkwiseTransformer(
        (Chunk((0, 1), ("a", "b")), Chunk((2, 3), ("c", "d"))),
        d_resid=4,
        site_C=(("a", 2), ("b", 3), ("c", 2), ("d", 3)),
        d_model=8,
        n_blocks=1,
        n_heads=2,
        mlp_hidden=16,
    )
    params = _batched_init(ct, jax.random.key(2))
    resid = jax.random.normal(jax.random.key(11), (5, 2, 3, 4))
    per_slot = jax.jit(ct.apply)(params, resid)

    def norm(h: jax.Array) -> jax.Array:
        return h / jnp.sqrt(jnp.mean(h * h, axis=-1, keepdims=True) + np.finfo(np.float32).eps)

    h = jnp.concatenate([norm(resid[2]), norm(resid[3])], axis=-1)
    ref = ct.net().apply(jax.tree.map(lambda a: a[1], params[0]), h)
    for j in range(2):
        np.testing.assert_allclose(np.asarray(per_slot[j][1]), np.asarray(ref[j]), atol=1e-5)


# The PartitionSpec of every parameter (after the unsharded chunks axis) on a (data, model) mesh.
EXPECTED_SPECS = {
    "w_in": ("data", "model"),
    "q": ("data", "model"),
    "k": ("data", "model"),
    "v": ("data", "model"),
    "o": ("model", "data"),
    "mlp_in": ("data", "model"),
    "mlp_out": ("model", "data"),
    "w_out": ("model", "data"),
}


# Nearly every example compiles a new init: few examples keep the file under a minute; the
# explicit ones make sure the unsharded jit, both sharded meshes and the largest chunk count
# always run.
@pytest.mark.slow  # over 10 s: `make test-fast` leaves it to the full suite
@settings(max_examples=3)
@example(seed=2**32 - 1, n_chunks=5, size=(16, 1, 2, 32), model=4)
@example(seed=0, n_chunks=2, size=(8, 1, 1, 16), model=2)
@example(seed=1, n_chunks=3, size=(8, 1, 1, 16), model=0)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_chunks=st.sampled_from([1, 2, 3, 5]),
    size=st.sampled_from([(8, 1, 1, 16), (16, 1, 2, 32)]),  # d_model, n_blocks, heads, mlp
    model=st.sampled_from([0, 2, 4]),  # 0: unsharded jit on one device
)
def test_i1_chunk_init_over_chunk_counts_sharded_equals_unrolled(
    seed: int, n_chunks: int, size: tuple[int, int, int, int], model: int
) -> None:
    ct = _ci(n_chunks, *size)
    key = jax.random.key(seed)
    params = _sharded_init(ct, model)(ct, key) if model else _batched_init(ct, key)
    ref = _unrolled_init(ct, key)
    assert len(params) == len(ref) == 1
    assert {m: set(p) for m, p in params[0].items()} == {m: set(p) for m, p in ref[0].items()}
    for m, module in params[0].items():
        for n, leaf in module.items():
            assert leaf.shape[0] == n_chunks
            np.testing.assert_array_equal(np.asarray(leaf), np.asarray(ref[0][m][n]), f"{m}/{n}")
            if model:
                spec = (None, *EXPECTED_SPECS.get(n, (None,)))  # biases: replicated
                assert isinstance(leaf.sharding, NamedSharding)
                assert tuple(leaf.sharding.spec) == spec, f"{m}/{n}"
                # Really split: every device holds all chunks, 1/model of the wide axis and
                # 1/data of the other.
                ways = {None: 1, "model": model, "data": 4 // model}
                local = tuple(d // ways[e] for d, e in zip(leaf.shape, spec, strict=True))
                assert all(sh.data.shape == local for sh in leaf.addressable_shards), f"{m}/{n}"


def test_chunk_param_shardings_fail_loudly() -> None:
    mesh = make_mesh({"data": 1, "model": 4})
    with pytest.raises(
        ShardingError, match=r"parameter \S+: axis 'wide' of size 6 does not divide"
    ):
        ci_param_shardings(_ci(2, d_model=6, n_heads=1, mlp_hidden=8), mesh)
    with pytest.raises(
        ShardingError, match=r"parameter 0/block_0/mlp_(in|out): axis 'wide' of size 10"
    ):
        ci_param_shardings(_ci(2, d_model=8, n_heads=1, mlp_hidden=10), mesh)


def test_a_parameter_without_logical_axes_is_refused_not_replicated() -> None:
    class NewWeight:
        """The chunkwise transformer's axes, for parameters with a name it does not know."""

        def init(self, ci_key: jax.Array) -> GroupParams:
            del ci_key
            return ({"block_0": {"gate": jnp.zeros((2, 4, 4))}},)

        def param_axes(self, path: tuple[object, ...], ndim: int) -> tuple[str | None, ...]:
            return _ci().param_axes(path, ndim)

    with pytest.raises(ShardingError, match="chunkwise CI parameter gate has no logical axes"):
        ci_param_shardings(NewWeight(), make_mesh({"data": 1, "model": 4}))
