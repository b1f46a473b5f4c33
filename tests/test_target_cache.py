"""The cache of targets pd trains in-process (`pd.targets.train`): keyed by the config and the
contents of the data files the target is trained from, and safe under concurrent writers and
readers of one entry (each entry is one file, renamed into place whole)."""

import dataclasses
import logging
import multiprocessing
import threading
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from pd.data import DataError
from pd.targets.configs import LlamaConfig, TMSConfig
from pd.targets.lm import build_llama, load_llama
from pd.targets.train import TrainedTarget, _cache_key, _load, _save

SMALL_LM = LlamaConfig(vocab=16, d_model=16, n_heads=2, n_kv_heads=1, d_mlp=32, seq_len=8)


def _write_tokens(path: Path, seed: int) -> None:
    np.save(path, np.random.default_rng(seed).integers(0, 16, 4096, dtype=np.uint16))


def test_a_token_file_whose_contents_change_is_trained_on_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PD_CACHE_DIR", str(tmp_path / "cache"))
    trainings: list[LlamaConfig] = []

    def fake_train_lm(model: object, cfg: LlamaConfig) -> TrainedTarget:  # training is not tested
        trainings.append(cfg)
        n = float(len(trainings))
        return TrainedTarget({"~": {"w": jnp.full((3,), n)}}, 0, n, from_cache=False)

    monkeypatch.setattr("pd.targets.lm.train_lm", fake_train_lm)
    tokens = tmp_path / "tokens.npy"
    _write_tokens(tokens, 0)
    cfg = dataclasses.replace(SMALL_LM, tokens=str(tokens))
    model = build_llama(cfg, C=4)

    first = load_llama(cfg, model)
    again = load_llama(cfg, model)
    assert not first.from_cache and again.from_cache and len(trainings) == 1
    _write_tokens(tokens, 1)  # same path, same size, other ids
    changed = load_llama(cfg, model)
    assert not changed.from_cache and len(trainings) == 2 and changed.loss == 2.0
    _write_tokens(tokens, 0)  # the first contents again: their entry is still there
    back = load_llama(cfg, model)
    assert back.from_cache and back.loss == 1.0 and len(trainings) == 2


def test_the_key_holds_the_data_files_contents_not_only_their_paths(tmp_path: Path) -> None:
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    _write_tokens(a, 0)
    _write_tokens(b, 0)
    cfg = dataclasses.replace(SMALL_LM, tokens=str(a))
    key = _cache_key(cfg, (a,))
    assert _cache_key(cfg, (b,)) == key  # equal bytes: equal digest
    _write_tokens(b, 1)
    assert _cache_key(cfg, (b,)) != key
    assert _cache_key(cfg) != key  # no data files: the config alone


def test_a_missing_token_file_is_named_before_anything_is_hashed(tmp_path: Path) -> None:
    cfg = dataclasses.replace(SMALL_LM, tokens=str(tmp_path / "nowhere.npy"))
    with pytest.raises(DataError, match=r"nowhere\.npy does not exist"):
        load_llama(cfg, build_llama(cfg, C=4))


def test_a_truncated_entry_is_a_logged_miss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "entry"
    _save(path, _trained(7), TMSConfig())
    loaded = _load(path)
    assert loaded is not None and loaded.loss == 7.0 and loaded.attempt == 0
    npz = path.with_suffix(".npz")
    npz.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="pd.targets.train"):
        assert _load(path) is None
    assert "corrupt" in caplog.text


# The stress test: PROCESSES processes of THREADS threads each save and load one entry ROUNDS
# times, all at once (threads as well as processes: a run may save from more than one thread).
PROCESSES, THREADS, ROUNDS, SIDE = 2, 3, 20, 384  # 384² float32: 590 kB, writes that overlap
WRITERS = PROCESSES * THREADS


def _trained(value: int) -> TrainedTarget:
    params = {"~": {"a": jnp.full((SIDE, SIDE), float(value)), "b": jnp.full((7,), float(value))}}
    return TrainedTarget(params, value // 1000, float(value), from_cache=False)


def _rounds(path: Path, writer: int, report: dict[str, list[str]]) -> None:
    """Save this writer's param sets and load the entry after each save; note what went wrong
    (exceptions, misses, loads that are not exactly one written set)."""
    written = {w * 1000 + r for w in range(WRITERS) for r in range(ROUNDS)} | {-1}
    for r in range(ROUNDS):
        try:
            _save(path, _trained(writer * 1000 + r), TMSConfig())
        except Exception as err:
            report["errors"].append(f"save: {err!r}")
        try:
            got = _load(path)
        except Exception as err:
            report["errors"].append(f"load: {err!r}")
            continue
        if got is None:
            report["misses"].append(f"writer {writer} round {r}")
            continue
        a, b = np.asarray(got.params["~"]["a"]), np.asarray(got.params["~"]["b"])
        value = int(got.loss)
        ok = (
            value in written
            and a.shape == (SIDE, SIDE)
            and b.shape == (7,)
            and bool(np.all(a == value) and np.all(b == value))
            and got.attempt == value // 1000
            and got.from_cache
        )
        if not ok:
            report["wrong"].append(f"writer {writer} round {r}: loss {got.loss}, a {a.flat[0]}")


def _stress_process(
    path: str,
    process: int,
    barrier: "multiprocessing.synchronize.Barrier",
    results: "multiprocessing.Queue[dict[str, list[str]]]",
) -> None:
    report: dict[str, list[str]] = {"errors": [], "misses": [], "wrong": [], "warnings": []}

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            report["warnings"].append(record.getMessage())

    logging.getLogger("pd.targets").addHandler(Collect(logging.WARNING))
    _trained(0)  # JAX started before the race
    barrier.wait()
    threads = [
        threading.Thread(target=_rounds, args=(Path(path), process * THREADS + t, report))
        for t in range(THREADS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put(report)


def test_concurrent_writers_and_readers_of_one_entry_never_see_a_broken_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "targets" / "entry"
    _save(path, _trained(-1), TMSConfig())  # from here on, every load must find an entry
    ctx = multiprocessing.get_context("spawn")  # no fork of a process running JAX's threads
    barrier = ctx.Barrier(PROCESSES)
    results: multiprocessing.Queue[dict[str, list[str]]] = ctx.Queue()
    procs = [
        ctx.Process(target=_stress_process, args=(str(path), w, barrier, results))
        for w in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    reports = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    total = {k: [m for rep in reports for m in rep[k]] for k in reports[0]}
    counts = ", ".join(f"{len(v)} {k}" for k, v in total.items())
    first = next((v[0] for v in total.values() if v), "")
    assert total == {"errors": [], "misses": [], "wrong": [], "warnings": []}, (
        f"{WRITERS} writers × {ROUNDS} rounds: {counts}; first: {first}"
    )
    leftovers = sorted(f.name for f in path.parent.iterdir())
    assert leftovers == ["entry.npz"], leftovers  # no temporary file is left behind
