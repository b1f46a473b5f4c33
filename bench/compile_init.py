"""Compile-only seconds of pd's initializers against unrolled per-site / per-chunk references, at
the Llama-3-8B production shape on 8 simulated CPU devices (nothing is allocated).

    python bench/compile_init.py [--layers 32] [--scaling 1,4,32] [--no-reference]
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import argparse
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from pd.adversary import init_sources
from pd.ci.chunkwise import Chunk, ChunkwiseTransformer
from pd.init import init_vu
from pd.shard import make_mesh, named_sharding, source_shardings, vu_shardings
from pd.sites import SiteSpec, SiteTable

D, MLP, KV = 4096, 14336, 1024  # d_model, MLP width, 8 KV heads × 128
KINDS = {  # kind: (d_in, d_out, C)
    "q": (D, D, 2048),
    "k": (D, KV, 2048),
    "v": (D, KV, 4096),
    "o": (D, D, 4096),
    "gate": (D, MLP, 8192),
    "up": (D, MLP, 8192),
    "down": (MLP, D, 10240),
}
T, SEQS = 512, 8  # sources `bsc`: one sequence of 512 tokens per device


def table(n_layers: int) -> SiteTable:
    return SiteTable(
        tuple(
            SiteSpec(f"layers.{i}.{'attn' if k in 'qkvo' else 'mlp'}.{k}", *KINDS[k], i, k)
            for i in range(n_layers)
            for k in KINDS
        ),
        n_layers,
    )


def ci_fn(t: SiteTable, n_layers: int) -> ChunkwiseTransformer:
    chunks = tuple(
        Chunk((i,), tuple(s.name for s in t.sites[7 * i : 7 * i + 7])) for i in range(n_layers)
    )
    return ChunkwiseTransformer(
        chunks,
        D,
        tuple((s.name, s.C) for s in t.sites),
        d_model=4096,
        n_blocks=4,
        n_heads=64,
        mlp_hidden=16384,
    )


def compile_seconds(
    fn: Callable[[jax.Array], object], out_shardings: object
) -> tuple[float, float, float]:
    """(trace, lower, backend compile) seconds of `jit(fn)` on an abstract key."""
    clear_caches: Callable[[], None] = jax.clear_caches  # unannotated upstream
    clear_caches()  # a fresh jit object would otherwise hit the in-memory cache
    key = jax.eval_shape(lambda: jax.random.key(0))
    jitted = jax.jit(fn, out_shardings=out_shardings)
    t0 = time.perf_counter()
    traced = jitted.trace(key)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    lowered.compile()
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def measure(n_layers: int, mesh: Mesh, reference: bool) -> dict[str, tuple[float, ...]]:
    t = table(n_layers)
    ci = ci_fn(t, n_layers)
    out: dict[str, tuple[float, ...]] = {}
    out["init_vu"] = compile_seconds(lambda k: init_vu(k, t), vu_shardings(t, mesh))
    ci_shape = jax.eval_shape(ci.init, jax.random.key(0))
    replicated = named_sharding("CI weights", (), (), mesh)
    ci_shard = jax.tree.map(lambda _: replicated, ci_shape)
    out["init_ci_fn"] = compile_seconds(lambda k: ci.init(jax.random.fold_in(k, 1)), ci_shard)
    src_shard = source_shardings(t, (SEQS, T), per_example=True, mesh=mesh)
    out["init_sources"] = compile_seconds(lambda k: init_sources(k, 0, t, (SEQS, T)), src_shard)
    if reference:
        out["init_vu (per-site ref)"] = compile_seconds(
            lambda k: unrolled_vu(k, t), per_site_vu(t, mesh)
        )
        out["init_ci_fn (unrolled ref)"] = compile_seconds(
            lambda k: unrolled_ci(jax.random.fold_in(k, 1), ci), ci_shard
        )
    return out


def unrolled_vu(key: jax.Array, t: SiteTable) -> list[jax.Array]:
    """The 'before' of the pull request: one draw and one sharded output per site."""
    keys = jax.random.split(key, 2 * len(t.sites))
    outs = []
    for i, s in enumerate(t.sites):
        outs.append(jax.random.normal(keys[2 * i], (s.d_in, s.C)) / jnp.sqrt(jnp.float32(s.d_in)))
        outs.append(jax.random.normal(keys[2 * i + 1], (s.C, s.d_out)) / jnp.sqrt(jnp.float32(s.C)))
    return outs


def per_site_vu(t: SiteTable, mesh: Mesh) -> list[NamedSharding]:
    out = []
    for s in t.sites:
        out.append(named_sharding(s.name, (s.d_in, s.C), ("d_in", None), mesh))
        out.append(named_sharding(s.name, (s.C, s.d_out), (None, "d_out"), mesh))
    return out


def unrolled_ci(ci_key: jax.Array, ci: ChunkwiseTransformer) -> object:
    """A Python loop over chunks with the same keys, then stacked (the pull request's 'before')."""
    net, x = ci.net(), jnp.zeros((1, 1, ci.input_dim))
    per_chunk = [net.init(jax.random.fold_in(ci_key, i), x) for i in range(len(ci.chunks))]
    return (jax.tree.map(lambda *a: jnp.stack(a), *per_chunk),)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--scaling", default="1,4,32")
    parser.add_argument("--no-reference", action="store_true")
    args = parser.parse_args()
    mesh = make_mesh({"data": 8, "model": 1})
    print(f"{jax.device_count()} simulated devices, mesh {dict(mesh.shape)}")
    sites, chunks = 7 * args.layers, args.layers
    print(f"\n{args.layers} layers ({sites} sites, {chunks} CI chunks): compile-only seconds")
    print(f"{'initializer':<28} {'trace':>7} {'lower':>7} {'compile':>8} {'total':>7}")
    results = measure(args.layers, mesh, not args.no_reference)
    for name, (tr, lo, co) in results.items():
        print(f"{name:<28} {tr:7.2f} {lo:7.2f} {co:8.2f} {tr + lo + co:7.2f}", flush=True)
    if not args.no_reference:
        pairs = (("init_vu", "init_vu (per-site ref)"), ("init_ci_fn", "init_ci_fn (unrolled ref)"))
        for pd_name, ref in pairs:
            ratio = sum(results[ref]) / sum(results[pd_name])
            print(f"{pd_name}: {ratio:.1f}x faster to compile than its reference")
    print("\nscaling of pd's initializers (total compile-only seconds)")
    print(f"{'layers':>6} {'init_vu':>8} {'init_ci_fn':>10} {'init_sources':>12}")
    for n in (int(v) for v in args.scaling.split(",")):
        r = measure(n, mesh, reference=False)
        vu, ci, src = (sum(r[k]) for k in ("init_vu", "init_ci_fn", "init_sources"))
        print(f"{n:>6} {vu:8.2f} {ci:10.2f} {src:12.2f}", flush=True)


if __name__ == "__main__":
    main()
