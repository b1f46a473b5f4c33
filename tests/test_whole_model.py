"""`smollm2_full`: every matrix of SmolLM2-135M (30 layers × 7 kinds = 210 sites) decomposed end to
end on this CPU, ten steps, into a complete run folder with the whole-model evaluation."""

import json
from pathlib import Path

import pytest

from pd.train import load_config, run
from pd.train.folder import RunFolder
from pd.train.report import MASKS

# Ten steps of the preset as it is (its 210 sites, chunkwise CI, chunks(30) plan, adversary,
# every evaluation); only its sizes shrink to fit a test: C 8 per site, CI transformers of
# width 32, one 16-token sequence per step, a 40-step warmup, two evaluation sequences and no
# fresh adversary (tests/test_evaluation_tables.py runs it).
SMALL = [
    "train.steps=10",
    "train.log_every=5",
    "train.batch=1",
    "train.faith_warmup_steps=40",
    "target.seq_len=16",
    "target.kind_C={q=8,k=8,v=8,o=8,gate=8,up=8,down=8}",
    "chunkwise.d_model=32",
    "chunkwise.mlp_hidden=64",
    "eval.n_samples=2",
    "eval.batch=1",
    "eval.pgd_steps=[]",
]


@pytest.mark.slow
def test_ten_steps_of_smollm2_full_write_a_complete_run_folder(tmp_path: Path) -> None:
    result = run(load_config("smollm2_full", SMALL), tmp_path / "run")
    files = RunFolder(result.run_dir)
    # The frozen model is over the size a run folder copies: its fingerprint alone.
    frozen = files.frozen.with_suffix(".json")
    for path in (files.config, files.summary, files.evaluation, files.decomposition, frozen):
        assert path.is_file(), path
    for figure in ("ci_sequence.png", "layers.png", "losses.png"):
        assert (result.run_dir / figure).stat().st_size > 10_000, figure
    rows = [json.loads(line) for line in files.metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 5, 9]

    summary = json.loads(files.summary.read_text())
    names = result.recipe.table.names
    assert len(names) == 210
    assert all(f"alive/{n}" in summary and f"ci_l0/{n}" in summary for n in names)
    assert sorted(int(k.split("/")[1]) for k in summary if k.startswith("layer_C/")) == list(
        range(30)
    )
    assert summary["layer_C/0"] == 7 * 8
    for mask in MASKS:
        assert f"ce/{mask}" in summary, mask
    table = files.evaluation.read_text()
    assert table.count("\n| ") == 1 + len(MASKS) + 1 + 30  # the rows under both heads
