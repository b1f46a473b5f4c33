"""How many subcomponents a site of a language-model run needs: with every site under its CI
mask, cut one site to the k subcomponents with the highest CI at each position and see how far
the masked model moves from the target.

python -m pd.train smollm2 --out runs/smollm2
python examples/top_k.py runs/smollm2 layers.29.mlp.down 64 144 200 300
"""

import argparse
from collections.abc import Sequence

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

import pd
from pd.losses import kl


def top_k(ci: Float[Array, "B T C"], k: int) -> Float[Array, "B T C"]:
    """`ci` where a subcomponent is among the `k` highest at its position (ties: the lower
    index first), 0 elsewhere."""
    rank = jnp.argsort(jnp.argsort(-ci, axis=-1, stable=True), axis=-1, stable=True)
    return jnp.where(rank < k, ci, 0.0)


def cut_kl(
    decomposition: pd.Decomposition, x: Int[Array, "B T"], site: str, ks: Sequence[int]
) -> dict[int, float]:
    """Per k in `ks`, KL(clean ‖ CI-masked) (SPEC S25) with `site` cut to its top k."""
    clean = decomposition.clean(x)
    ci = decomposition.ci(x)
    return {
        k: float(kl(decomposition.masked_forward(x, {**ci, site: top_k(ci[site], k)}), clean))
        for k in ks
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("site", help="a site of the run, e.g. layers.29.mlp.down")
    parser.add_argument("k", type=int, nargs="+", help="subcomponents kept per position")
    parser.add_argument("--batches", type=int, default=4, help="held-out batches read")
    args = parser.parse_args()
    decomposition = pd.load(args.run_dir)
    if args.site not in decomposition.sites:
        parser.error(
            f"site {args.site!r} is not in the run, expected one of its sites "
            f"({', '.join(decomposition.sites)})"
        )
    x = jnp.concatenate([decomposition.batch(b, evaluation=True) for b in range(args.batches)])
    C = decomposition.V[args.site].shape[1]
    kls = cut_kl(decomposition, x, args.site, [*args.k, C])
    print(f"{args.site}, {x.shape[0]} held-out windows of {x.shape[1]} tokens")
    for k, value in kls.items():
        note = "  (all of them: the CI masks)" if k == C else ""
        print(f"  top {k:>5}: KL {value:.3f}{note}")


if __name__ == "__main__":
    main()
