"""§13: identity and dense CI error, MMCS and ML2R on hand-made matrices; evaluation programs
shared between equal recipes."""

import numpy as np

from pd.train import load_config
from pd.train.evaluate import (
    ci_program,
    dense_ci_error,
    identity_ci_error,
    make_eval_step,
    mmcs_ml2r,
)
from pd.train.kinds import as_toy
from pd.train.run import make_recipe
from pd.xla import one_per_value


def test_identity_ci_error_permutes_columns() -> None:
    ci = np.zeros((3, 5))
    ci[0, 4] = ci[1, 0] = ci[2, 2] = 1.0
    assert identity_ci_error(ci, 0.1) == 0
    ci[0, 1] = 0.15  # off-diagonal above tol 0.1, not above 0.2
    ci[2, 2] = 0.85  # matched entry below 1 − 0.1, not below 1 − 0.2
    assert identity_ci_error(ci, 0.1) == 2
    assert identity_ci_error(ci, 0.2) == 0


def test_dense_ci_error_uses_the_k_most_used_columns() -> None:
    ci = np.zeros((5, 20))
    ci[:, 3] = 1.0
    ci[:, 7] = 1.0
    assert dense_ci_error(ci, 2, 0.1) == 0
    ci[1, 9] = 0.5  # a third column in use
    assert dense_ci_error(ci, 2, 0.1) == 1
    assert dense_ci_error(ci, 3, 0.1) == 1  # column 9 is in the top 3 but has no entry ≥ 0.9


def test_mmcs_ml2r_perfect_and_scaled() -> None:
    W = np.asarray([[1.0, 0.0], [0.6, 0.8], [0.0, 2.0]])
    V = np.eye(3)  # subcomponent c owns feature c
    alive = np.ones(3, dtype=bool)
    assert mmcs_ml2r(W, V, W.copy(), alive) == (1.0, 1.0)
    mmcs, ml2r = mmcs_ml2r(W, V, 0.5 * W, alive)
    assert mmcs == 1.0 and abs(ml2r - 0.5) < 1e-12


def test_mmcs_ml2r_ignores_dead_remnants() -> None:
    W = np.asarray([[1.0, 0.0], [0.0, 1.0]])
    # subcomponents 0, 1 alive but slightly rotated; 2, 3 dead remnants aligned with the features
    V = np.asarray([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    U = np.asarray([[1.0, 0.1], [0.1, 1.0], [1e-4, 0.0], [0.0, 1e-4]])
    mmcs, ml2r = mmcs_ml2r(W, V, U, np.asarray([True, True, False, False]))
    assert mmcs < 1.0 and abs(ml2r - float(np.hypot(1.0, 0.1))) < 1e-9


def test_equal_recipes_share_one_evaluation_program() -> None:
    """A run's evaluations, and a sweep's members, compile `eval_step` once:
    equal recipes (built twice from one config) get the same jitted program; a different
    recipe its own; arguments compare by their pytree leaves (a state's placement, whose
    parameter dicts cannot be hashed), and leaves that cannot be hashed get a new one each
    time; a default argument given or left out is one call."""
    recipe, again = (make_recipe(load_config("tms_5-2", [])) for _ in range(2))
    other = make_recipe(load_config("tms_5-2", ["C=7"]))
    toy = as_toy(recipe.target)
    assert make_eval_step(recipe, toy, 64) is make_eval_step(again, as_toy(again.target), 64)
    assert ci_program(recipe) is ci_program(again)
    assert make_eval_step(other, as_toy(other.target), 64) is not make_eval_step(recipe, toy, 64)
    made: list[object] = []

    def build(x: object, y: int | None = None) -> int:
        made.append(x)
        return len(made)

    make = one_per_value(build)
    one = np.ones(1)
    assert make(one) == 1 and make(one) == 2  # an array cannot be hashed: built again
    assert make({"a": [1]}) == 3 and make({"a": [1]}) == 3  # compared leaf by leaf
    assert make({"a": [2]}) == 4 and make({"b": [1]}) == 5
    # Bound to the parameters, defaults filled in: one call however it is spelled.
    assert make(2) == 6 and make(2, None) == 6 and make(x=2, y=None) == 6 and make(2, 3) == 7
