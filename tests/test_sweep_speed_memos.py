"""The memos the sweep's speed rests on answer what computing afresh answers (issue 30)."""

from __future__ import annotations

import dataclasses
import pickle

from infersim.cards.schema import hash_kept
from infersim.deployment import Deployment
from infersim.mfu.interpolation import build_grid


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
