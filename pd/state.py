"""The pytrees that change during training (SPEC §2)."""

from typing import NamedTuple

import optax
from jaxtyping import Array, Float, Int

from pd.adversary import SourceAdam, Sources
from pd.ci import GroupParams


class Components(NamedTuple):
    """V and U stacked per shape group: `V[g]: [n_g, d_in, C]`, `U[g]: [n_g, C, d_out]`."""

    V: tuple[Float[Array, "_n _d_in _C"], ...]
    U: tuple[Float[Array, "_n _C _d_out"], ...]


class TrainState(NamedTuple):
    """Everything a step reads and writes; the frozen target is a separate argument."""

    step: Int[Array, ""]
    components: Components
    ci_params: GroupParams
    opt_components: optax.OptState
    opt_ci: optax.OptState
    sources: Sources  # persistent adversarial sources per C group; () without an adversary
    source_opt: SourceAdam
