"""§4.1: the chunkwise-transformer CI function — homogeneity, S27, I1 and scan = per-chunk."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd.ci.chunkwise import Chunk, ChunkwiseTransformer


def _ci(n_chunks: int = 3) -> ChunkwiseTransformer:
    chunks = tuple(
        Chunk(taps=(f"resid.{i}",), sites=(f"layers.{i}.q", f"layers.{i}.up"))
        for i in range(n_chunks)
    )
    return ChunkwiseTransformer(
        chunks=chunks,
        tap_dims=tuple((f"resid.{i}", 8) for i in range(n_chunks)),
        site_C=tuple(
            (s, C)
            for i in range(n_chunks)
            for s, C in ((f"layers.{i}.q", 5), (f"layers.{i}.up", 7))
        ),
        d_model=16,
        n_blocks=2,
        n_heads=2,
        mlp_hidden=32,
    )


def test_chunks_must_be_homogeneous() -> None:
    ci = _ci()
    swapped = (ci.chunks[0], Chunk(taps=("resid.1",), sites=("layers.1.up", "layers.1.q")))
    with pytest.raises(ValueError, match="per-slot C tuples"):
        ChunkwiseTransformer(swapped, ci.tap_dims, ci.site_C, 16, 2, 2, 32)
    wide = (*ci.tap_dims[:1], ("resid.1", 9))
    with pytest.raises(ValueError, match="input widths"):
        ChunkwiseTransformer(ci.chunks[:2], wide, ci.site_C, 16, 2, 2, 32)


def test_s27_rope_frequencies_are_not_parameters_and_init_scales() -> None:
    params = _ci().init(jax.random.key(0))[0]
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
    batched = jax.jit(ci.init)(key)[0]
    net = ci.net()
    x = jnp.zeros((1, 1, ci.input_dim))
    for i in range(len(ci.chunks)):
        ref = jax.jit(net.init)(jax.random.fold_in(key, i), x)
        for a, b in zip(jax.tree.leaves(batched), jax.tree.leaves(ref), strict=True):
            np.testing.assert_array_equal(np.asarray(a[i]), np.asarray(b))


def test_scan_over_chunks_equals_each_chunk_alone() -> None:
    ci = _ci()
    params = ci.init(jax.random.key(1))
    taps = {f"resid.{i}": jax.random.normal(jax.random.key(10 + i), (2, 6, 8)) for i in range(3)}
    out = jax.jit(ci.apply)(params, taps)
    assert {k: v.shape for k, v in out.items()}["layers.2.up"] == (2, 6, 7)
    net = ci.net()
    for i, chunk in enumerate(ci.chunks):
        chunk_params = jax.tree.map(lambda a, i=i: a[i], params[0])
        h = taps[chunk.taps[0]]
        h = h / jnp.sqrt(jnp.mean(h * h, axis=-1, keepdims=True) + np.finfo(np.float32).eps)
        ref = net.apply(chunk_params, h)
        for j, site in enumerate(chunk.sites):
            np.testing.assert_allclose(np.asarray(out[site]), np.asarray(ref[j]), atol=1e-5)
