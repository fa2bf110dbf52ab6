"""The memos the sweep's speed rests on answer what computing afresh answers."""

from __future__ import annotations

import dataclasses
import pickle

from infersim.cards.schema import hash_kept
from infersim.cards.deployment import Deployment
from infersim.tables.interpolation import build_grid


def _grid():
    # a ragged two-axis grid (batch x kv_len) with a knee, so that the convex envelope and the
    # extension above the range are both in play
    points = []
    for batch in (1, 2, 4, 8, 16):
        for kv in (256, 1024, 4096, 16384):
            if batch == 16 and kv == 16384:
                continue
            seconds = 5e-6 + 1e-10 * batch * kv + (2e-6 if batch > 4 else 0.0)
            points.append(((batch, kv), seconds, 0.5))
    return build_grid(("batch", "kv_len"), points, 1e15)


def test_grid_rows_kept_answer_as_a_fresh_grid():
    queries = [(b, kv) for kv in (300, 1024, 5000, 20000, 100) for b in (1, 3, 5, 7, 12, 16, 30)]
    kept = _grid()
    first = [kept.evaluate(q, 1e9) for q in queries]
    again = [kept.evaluate(q, 1e9) for q in reversed(queries)][::-1]  # now from the kept rows
    fresh = [_grid().evaluate(q, 1e9) for q in queries]  # a new grid: nothing kept yet
    assert first == again == fresh
    # what a grid keeps of its evaluations is not pickled with it (a cached table holds none)
    assert len(pickle.dumps(kept)) == len(pickle.dumps(_grid()))
    assert [pickle.loads(pickle.dumps(kept)).evaluate(q, 1e9) for q in queries] == fresh
    assert any(v.clamps for v in fresh) and any(not v.clamps and not v.exact for v in fresh)


@hash_kept
@dataclasses.dataclass(frozen=True)
class _Pair:
    name: str
    size: int


def test_kept_hash_is_the_generated_one_and_is_not_pickled():
    plain = dataclasses.dataclass(frozen=True)(type("Plain", (), {"__annotations__": {"name": str, "size": int}}))
    pair = _Pair("a", 2)
    assert hash(pair) == hash(plain("a", 2)) == hash(pair)
    assert pair == _Pair("a", 2) and dataclasses.asdict(pair) == {"name": "a", "size": 2}
    assert "_kept_hash" not in pickle.loads(pickle.dumps(pair)).__dict__
    assert "_kept_hash" not in dataclasses.replace(pair, size=3).__dict__
    dep = Deployment(num_gpus=8)
    assert hash(dep) == hash(Deployment(num_gpus=8)) and {dep: 1}[Deployment(num_gpus=8)] == 1


def test_a_section_swept_on_its_own_fields_is_the_one_set_field_by_field():
    from infersim.sweep import load_base, parse_grid
    from infersim.sweep.variants import Deriver, set_path

    base = load_base("qwen3-30b.yaml")
    axes = parse_grid(["workload.isl=1024,4096", "deployment.attention.tp=1,2", "workload.decode_batch_per_gpu=8,64"])
    deriver = Deriver(base, axes)
    for values in ((1024, 1, 8), (4096, 2, 64), (1024, 1, 8)):
        expected = set_path(set_path(base.config.workload, ("isl",), values[0]), ("decode_batch_per_gpu",), values[2])
        assert deriver.workload(values) == expected


def test_completed_layout_kept_as_the_last_answer_is_a_fresh_one():
    import pytest

    from infersim.base.errors import InferSimError
    from infersim.sweep import load_base, parse_grid
    from infersim.sweep.variants import Deriver

    base = load_base("qwen3-30b.yaml")
    axes = parse_grid(["deployment.attention.tp=1,3,2", "workload.isl=1024,2048"])
    deriver = Deriver(base, axes)
    checked_error = False
    for values in ((1, 1024), (1, 2048), (3, 1024), (3, 2048), (2, 1024), (1, 1024)):
        fresh = Deriver(base, axes)  # nothing kept
        try:
            expected = fresh.parts(values)
        except InferSimError as exc:
            with pytest.raises(InferSimError) as kept:
                deriver.parts(values)  # the kept answer raises again (the second time from the last answer)
            assert str(kept.value) == str(exc)
            checked_error = True
            continue
        assert deriver.parts(values) == expected
    assert checked_error  # attention TP 3 does not fill the 4 GPUs
