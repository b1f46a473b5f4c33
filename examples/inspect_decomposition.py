"""Load a finished run and query it from typed research code.

python -m pd.train tms_5-2 --out runs/tms_5-2
python examples/inspect_decomposition.py runs/tms_5-2
"""

import sys

import jax.numpy as jnp
from jaxtyping import Array, Float

import pd
from pd.train.kinds import as_toy


def active_subcomponents(
    decomposition: pd.Decomposition, x: Float[Array, "B n"]
) -> dict[str, list[int]]:
    """The subcomponents whose CI exceeds 0.1 on any row of `x`, per site."""
    return {
        site: [int(c) for c in jnp.flatnonzero(jnp.max(ci, axis=0) > 0.1)]
        for site, ci in decomposition.ci(x).items()
    }


def main(run_dir: str) -> None:
    decomposition = pd.load(run_dir)
    n = as_toy(decomposition.recipe.target).n_features
    probe = 0.75 * jnp.eye(n)
    print("active subcomponents on the one-hot probes:", active_subcomponents(decomposition, probe))
    # Keep only the subcomponents CI says are needed: the output should match the target.
    ci = decomposition.ci(probe)
    masked = decomposition.masked_forward(probe, ci)
    error = float(jnp.max(jnp.abs(masked - decomposition.clean(probe))))
    print(f"max |CI-masked − clean| on the probes: {error:.4f}")
    for site in decomposition.sites:
        print(site, "V", decomposition.V[site].shape, "U", decomposition.U[site].shape)


if __name__ == "__main__":
    main(sys.argv[1])
