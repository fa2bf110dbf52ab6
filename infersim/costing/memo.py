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
- layers (`layer`): a layer's pieces joined into its operation tuple, keyed on the pieces
  themselves (their identities: the memo holds every piece it keys on, so an identity cannot be
  reused while its entry lives); pricing such a tuple prices each of its pieces once.
- kernel costs (`priced`), per (hardware card, tables) pair (held, so their identities cannot be
  reused either): the cost of each kernel shape (by hash and equality), and each piece's operations
  with their costs and the kernels it launches (by the piece's identity, the piece held).

Bounds: MAX_PIECES pieces, MAX_LAYERS layers, MAX_PAIRS (card, tables) pairs and, per pair,
MAX_SHAPES shape costs and MAX_PIECES priced pieces. A table that reaches its bound drops its
older half (insertion order) and goes on: a dropped entry is rebuilt when asked for again, which
costs time, never a different number. At the bounds the memo holds some 100 MB at most (pieces of
a few dozen operations, a few kB each; shape costs of a few hundred bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from itertools import chain, islice
from typing import Any

from infersim.cards.hardware import HardwareCard
from infersim.costing.timing import kernel_cost
from infersim.shapes.kernels import AnyShape, Cost, KernelTables
from infersim.shapes.plan import Operation

MAX_PIECES = 4096
MAX_LAYERS = 4096
MAX_PAIRS = 8
MAX_SHAPES = 100_000

Piece = tuple[Operation, ...]
# an operation priced: the operation, the cost of one of its kernels and the seconds of its `count`
# kernels (what a step's walk adds up)
Priced = tuple[Operation, Cost, float]


def _make_room(table: dict[Any, Any], bound: int) -> None:
    """Drop the older half of `table` (dicts keep insertion order) once it holds `bound` entries."""
    if len(table) >= bound:
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
            _make_room(shapes, MAX_SHAPES)
            cost = shapes[shape] = kernel_cost(shape, self.hw, self.tables)
        return cost

    def operation(self, op: Operation) -> Priced:
        cost = self.cost(op.shape)
        return op, cost, cost.seconds * op.count

    def piece(self, piece: Piece) -> tuple[Piece, tuple[Priced, ...], int]:
        """`piece` priced operation by operation, kept by its identity (the entry holds it)."""
        _make_room(self.pieces, MAX_PIECES)
        entry = self.pieces[id(piece)] = (piece, tuple(map(self.operation, piece)), sum(map(operation_kernels, piece)))
        return entry

    def layer(self, joined: Piece, parts: tuple[Piece, ...]) -> tuple[Piece, tuple[Priced, ...], int]:
        """A layer joined from `parts` priced piece by piece, kept by the joined tuple's identity."""
        pieces = self.pieces
        priced: list[Priced] = []
        kernels = 0
        for part in parts:
            _, part_priced, part_kernels = pieces.get(id(part)) or self.piece(part)
            priced += part_priced
            kernels += part_kernels
        _make_room(pieces, MAX_PIECES)
        entry = pieces[id(joined)] = (joined, tuple(priced), kernels)
        return entry


class PricingMemo:
    """Plan pieces, layers and kernel costs kept for one owner (see the module's docstring)."""

    __slots__ = ("_pieces", "_layers", "_parts", "_pairs", "_last_pair")

    def __init__(self) -> None:
        self._pieces: dict[tuple[Hashable, ...], Piece] = {}
        # the pieces' identities -> the joined operations; id(joined) -> (joined, its pieces)
        self._layers: dict[tuple[int, ...], Piece] = {}
        self._parts: dict[int, tuple[Piece, tuple[Piece, ...]]] = {}
        self._pairs: dict[tuple[int, int], _PairCosts] = {}
        self._last_pair: _PairCosts | None = None

    def piece(self, build: Callable[..., list[Operation]], *inputs: Hashable) -> Piece:
        """build(*inputs) as a tuple, kept under (build, *inputs): every input the builder is
        given is part of the key. Inputs must be hashable (frozen records, numbers, strings).
        A builder that raises is not kept (it raises again)."""
        key = (build, *inputs)
        piece = self._pieces.get(key)
        if piece is None:
            piece = tuple(build(*inputs))
            _make_room(self._pieces, MAX_PIECES)
            self._pieces[key] = piece
        return piece

    def layer(self, parts: tuple[Piece, ...]) -> Piece:
        """The operations of a layer made of `parts` (pieces this memo built), joined in order; the
        same tuple for the same pieces, so that pricing it prices each piece once."""
        key = tuple(map(id, parts))  # the entry below holds the parts: their identities stay theirs
        joined = self._layers.get(key)
        if joined is None:
            joined = tuple(chain.from_iterable(parts))
            _make_room(self._layers, MAX_LAYERS)
            _make_room(self._parts, MAX_LAYERS)
            self._layers[key] = joined
            self._parts[id(joined)] = (joined, parts)
        return joined

    def _pair(self, hw: HardwareCard, tables: KernelTables) -> _PairCosts:
        pair = self._last_pair
        if pair is not None and pair.hw is hw and pair.tables is tables:
            return pair
        key = (id(hw), id(tables))
        pair = self._pairs.get(key)
        if pair is None:
            _make_room(self._pairs, MAX_PAIRS)
            pair = self._pairs[key] = _PairCosts(hw, tables)
        self._last_pair = pair
        return pair

    def priced(self, operations: Piece, hw: HardwareCard, tables: KernelTables) -> tuple[tuple[Priced, ...], int]:
        """`operations` priced on (hw, tables), in order, and the kernels they launch, kept by the
        tuple's identity (the entry holds the tuple). A layer this memo joined is priced piece by
        piece (each piece once per pair), other operations one by one (each shape once per pair)."""
        pair = self._pair(hw, tables)
        entry = pair.pieces.get(id(operations))
        if entry is None:
            joined = self._parts.get(id(operations))
            entry = pair.piece(operations) if joined is None else pair.layer(*joined)
        return entry[1], entry[2]

    def sizes(self) -> dict[str, int]:
        """Entries kept in each table: pieces, layers, (card, tables) pairs, and over all pairs the
        shape costs and the priced pieces and layers."""
        pairs = self._pairs.values()
        return {"pieces": len(self._pieces), "layers": len(self._layers), "pairs": len(self._pairs),
                "shapes": sum(len(p.shapes) for p in pairs), "priced": sum(len(p.pieces) for p in pairs)}
