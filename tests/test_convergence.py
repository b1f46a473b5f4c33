"""A small TMS decomposition recovers the known answer: one subcomponent per feature (§13)."""

import pytest

from pd.train import load_config, run


@pytest.mark.slow
def test_tms_5_2_identity_ci_error_is_zero(tmp_path_factory: pytest.TempPathFactory) -> None:
    # The default job itself (about a minute on 2 cores), with a lighter evaluation.
    config = load_config("tms_5-2", ["eval.n_samples=20000", "eval.figures=false"])
    summary = run(config, tmp_path_factory.mktemp("runs") / "converge").summary
    for site in ("linear1", "linear2"):
        assert summary[f"identity_ci_error_0.1/{site}"] == 0.0, summary
        assert summary[f"alive/{site}"] == 5.0, summary
    assert summary["mmcs/linear1"] >= 0.99
    assert 0.95 <= summary["ml2r/linear1"] <= 1.05
