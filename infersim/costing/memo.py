"""PricingMemo: the plan pieces and kernel costs a sweep or a serving run prices again and again.

Building a step's plan and pricing its kernels are pure functions of frozen inputs, and a sweep or
a serving run asks for the same ones over and over: every configuration a swept field does not
touch shares most of a layer's operations and nearly all of its kernel shapes. A driver that runs
many steps (the sweep's evaluator, the serving step coster) creates one PricingMemo and passes it
to `build_stage_plan` / `build_step_plan` (infersim.modules.step) and to `run_stage` /
`stage_time` (infersim.engine.stage); `simulate()` of one configuration passes none and prices
plainly. Nothing is kept at module level: the memo lives and dies with its owner.

What is kept, and on what key:
- plan pieces (`piece`): the operations a builder returns, keyed on the builder and every
  argument it is given, by hash and equality (the builders take frozen records: the model card,
  the part of the deployment a layer's mixer or FFN is built from, the stage context). A builder
  that starts reading a field its arguments do not carry fails (AttributeError) instead of being
  served a plan built for other values, so a key cannot fall behind its builder.
- layers (`layer`): a layer's pieces joined into its operation tuple; the memo remembers which
  pieces the last RECENT_LAYERS joined tuples are made of (by the tuple's identity, the tuple
  held), so that pricing a layer right after its plan is built prices each of its pieces once.
- kernel costs (`priced`), per (hardware card, tables) pair (held, so their identities cannot be
  reused either): the cost of each kernel shape (by hash and equality), and each piece's operations
  with their costs and the kernels it launches (by the piece's identity, the piece held).

Bounds: MAX_PIECES pieces, RECENT_LAYERS layers, MAX_PAIRS (card, tables) pairs and, per pair,
MAX_SHAPES shape costs and MAX_PIECES priced pieces. A table that reaches its bound drops its
older half (insertion order) and goes on: a dropped entry is rebuilt when asked for again, which
costs time, never a different number (a layer priced after its entry is dropped is priced shape by
shape). A sweep of one hardware card and table set keeps some tens of MB at the bounds.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from itertools import chain, islice
from typing import Any, TypeVar

from infersim.cards.hardware import HardwareCard
from infersim.costing.timing import kernel_cost
from infersim.shapes.kernels import AnyShape, Cost, KernelTables
from infersim.shapes.plan import Operation

MAX_PIECES = 4096
RECENT_LAYERS = 16  # a plan (at most a few layer kinds) is priced right after it is built
MAX_PAIRS = 8
MAX_SHAPES = 100_000

T = TypeVar("T")
Piece = tuple[Operation, ...]
# an operation priced: the operation, the cost of one of its kernels and the seconds of its `count`
# kernels (what a step's walk adds up)
Priced = tuple[Operation, Cost, float]


def _drop_older_half(table: dict[Any, Any]) -> None:
    """Make room in a table at its bound: drop its older half (dicts keep insertion order)."""
    for key in list(islice(table, len(table) // 2 or 1)):
        del table[key]


def operation_kernels(op: Operation) -> int:
    """Kernels one operation launches: its count, times the kernels its shape is made of (an
    elementwise shape of several kernels, a linear-attention phase's kernels)."""
    return op.count * getattr(op.shape, "kernels", 1)


def priced_operation(op: Operation, hw: HardwareCard, tables: KernelTables) -> Priced:
    """`op` priced without a memo."""
    cost = kernel_cost(op.shape, hw, tables)
    return op, cost, cost.seconds * op.count


class _PairCosts:
    """The costs kept for one (hardware card, tables) pair."""

    __slots__ = ("hw", "tables", "shapes", "pieces")

    def __init__(self, hw: HardwareCard, tables: KernelTables) -> None:
        self.hw = hw  # held: the pair is keyed by these objects' identities
        self.tables = tables
        self.shapes: dict[AnyShape, Cost] = {}
        # id(piece) -> (the piece, held; its operations priced, in order; the kernels it launches)
        self.pieces: dict[int, tuple[Piece, tuple[Priced, ...], int]] = {}

    def cost(self, shape: AnyShape) -> Cost:
        shapes = self.shapes
        try:
            cost = shapes.get(shape)  # a miss raises nothing (a raised KeyError costs more)
        except TypeError:  # an unhashable shape: priced, not kept
            return kernel_cost(shape, self.hw, self.tables)
        if cost is None:
            if len(shapes) >= MAX_SHAPES:
                _drop_older_half(shapes)
            cost = shapes[shape] = kernel_cost(shape, self.hw, self.tables)
        return cost

    def operation(self, op: Operation) -> Priced:
        cost = self.cost(op.shape)
        return op, cost, cost.seconds * op.count

    def piece(self, piece: Piece) -> tuple[Piece, tuple[Priced, ...], int]:
        """`piece` priced operation by operation, kept by its identity (the entry holds it)."""
        if len(self.pieces) >= MAX_PIECES:
            _drop_older_half(self.pieces)
        entry = self.pieces[id(piece)] = (piece, tuple(map(self.operation, piece)), sum(map(operation_kernels, piece)))
        return entry


class PricingMemo:
    """Plan pieces, layers and kernel costs kept for one owner (see the module's docstring)."""

    __slots__ = ("_pieces", "_layers", "_pairs", "_last_pair", "_derived")

    def __init__(self) -> None:
        self._pieces: dict[tuple[Hashable, ...], Piece] = {}
        self._layers: dict[int, tuple[Piece, tuple[Piece, ...]]] = {}  # id(joined) -> (joined, held; its pieces)
        self._pairs: dict[tuple[int, int], _PairCosts] = {}
        self._last_pair: _PairCosts | None = None
        self._derived: dict[Callable[[Any], Any], tuple[object, Any]] = {}  # make -> (its last source, held; value)

    def derived(self, make: Callable[[Any], T], source: object) -> T:
        """make(source), kept while `source` is the last object `make` was given (by identity; the
        source is held): a sweep's consecutive plans mostly come from one deployment object, and
        the records made of it then keep their worked-out hashes from plan to plan."""
        last = self._derived.get(make)
        if last is not None and last[0] is source:
            return last[1]
        value = make(source)
        self._derived[make] = (source, value)
        return value

    def piece(self, build: Callable[..., list[Operation]], *inputs: Hashable) -> Piece:
        """build(*inputs) as a tuple, kept under (build, *inputs): every input the builder is
        given is part of the key. Inputs must be hashable (frozen records, numbers, strings).
        A builder that raises is not kept (it raises again)."""
        key = (build, *inputs)
        piece = self._pieces.get(key)
        if piece is None:
            piece = tuple(build(*inputs))
            if len(self._pieces) >= MAX_PIECES:
                _drop_older_half(self._pieces)
            self._pieces[key] = piece
        return piece

    def layer(self, parts: tuple[Piece, ...]) -> Piece:
        """The operations of a layer made of `parts` (pieces this memo built), joined in order;
        remembered as made of them (see the module's docstring)."""
        joined = tuple(chain.from_iterable(parts))
        if len(self._layers) >= RECENT_LAYERS:
            _drop_older_half(self._layers)
        self._layers[id(joined)] = (joined, parts)
        return joined

    def _pair(self, hw: HardwareCard, tables: KernelTables) -> _PairCosts:
        """The costs kept for (hw, tables), made the last pair asked for."""
        key = (id(hw), id(tables))
        pair = self._pairs.get(key)
        if pair is None:
            if len(self._pairs) >= MAX_PAIRS:
                _drop_older_half(self._pairs)
            pair = self._pairs[key] = _PairCosts(hw, tables)
        self._last_pair = pair
        return pair

    def priced(self, operations: Piece, hw: HardwareCard, tables: KernelTables) -> tuple[Sequence[Priced], int]:
        """`operations` priced on (hw, tables), in order, and the kernels they launch. A layer this
        memo joined is priced piece by piece, any other tuple as one piece (kept by its identity,
        the entry holding it): each piece is priced once per pair, each kernel shape once per pair."""
        pair = self._last_pair
        if pair is None or pair.hw is not hw or pair.tables is not tables:
            pair = self._pair(hw, tables)
        pieces = pair.pieces
        layer = self._layers.get(id(operations))
        if layer is None:
            entry = pieces.get(id(operations)) or pair.piece(operations)
            return entry[1], entry[2]
        priced: list[Priced] = []
        kernels = 0
        for part in layer[1]:
            _, part_priced, part_kernels = pieces.get(id(part)) or pair.piece(part)
            priced += part_priced
            kernels += part_kernels
        return priced, kernels

    def sizes(self) -> dict[str, int]:
        """Entries kept in each table: pieces, layers, (card, tables) pairs, and over all pairs the
        shape costs and the priced pieces."""
        pairs = self._pairs.values()
        return {"pieces": len(self._pieces), "layers": len(self._layers), "pairs": len(self._pairs),
                "shapes": sum(len(p.shapes) for p in pairs), "priced": sum(len(p.pieces) for p in pairs)}
