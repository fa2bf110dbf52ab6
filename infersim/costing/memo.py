"""PricingMemo: the plan pieces and kernel costs a sweep or a serving run prices again and again.

Building a step's plan and pricing its kernels are pure functions of frozen inputs, and a sweep or
a serving run asks for the same ones over and over: every configuration a swept field does not
touch shares most of a layer's operations and nearly all of its kernel shapes. A driver that runs
many steps (the sweep's evaluator, the serving step coster) creates one PricingMemo and passes it
to `build_stage_plan` / `build_step_plan` (infersim.modules.step) and to `run_stage` /
`stage_time` (infersim.engine.stage); `simulate()` of one configuration passes none and prices
plainly, but for the chunks of one long prompt, which `run_prefill` prices through a memo of their
own (they share every kernel but the attention core's). Nothing is kept at module level: the memo lives and dies with its owner.

What is kept, and on what key:
- plan pieces (`scope(...).piece`): the operations a builder returns, keyed on the builder and
  every argument it is given, by hash and equality: the leading ones (the model card, and the
  record of the deployment a layer's mixer or FFN is built from) select a scope, looked up by value
  once per deployment (the scopes asked for lately by their objects' identities), the others (the
  stage context or its FFN part, counts) key the piece within it. The builders take frozen records
  of exactly what they read, so a builder that starts reading a field its arguments do not carry
  fails (AttributeError) instead of being served a plan built for other values: a key cannot fall
  behind its builder.
- plan frames (`derived`): what is made of a (model card, deployment) pair of objects, the
  records and scopes its builders are given, holds the frame of the last plan built from them
  (infersim.modules.step): the pieces that do not read the sequences, kept on the stage, tokens,
  FFN context, micro-batches and logit rows they were built from, so that the next plan of other
  sequences over the same tokens (another context length, a real batch padded to the same
  CUDA-graph size) asks only for its cores.
- kernel costs (`part`), per (hardware card, tables) pair (held, so their identities cannot be
  reused either): the cost of each kernel shape (by hash and equality), and each part of a plan (a
  piece) priced: its operations with their costs, the kernels it launches and its sums (PricedPart;
  by the piece's identity, the piece held), so that a step whose layers share all but their cores
  with the last one adds up only the cores' operations.

Bounds: MAX_PIECES pieces over all scopes (and as many scopes), RECENT_SCOPES scopes found by
identity (and records made of as many deployments), MAX_PAIRS (card, tables) pairs and, per pair,
MAX_SHAPES shape costs and MAX_PIECES priced pieces. A table that reaches its bound drops its older
half (insertion order; at the pieces' bound, each scope its older half) and goes on: a dropped
entry is rebuilt when asked for again, which costs time, never a different number. A sweep of one
hardware card and table set keeps some tens of MB at the bounds.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from itertools import islice
from typing import Any, TypeVar

from infersim.cards.hardware import HardwareCard
from infersim.costing.timing import kernel_cost
from infersim.shapes.kernels import AnyShape, Bound, Cost, KernelTables
from infersim.shapes.plan import Operation

MAX_PIECES = 4096
RECENT_SCOPES = 64
MAX_PAIRS = 8
MAX_SHAPES = 100_000

T = TypeVar("T")
Piece = tuple[Operation, ...]
# an operation priced: the operation, the cost of one of its kernels and the seconds of its `count`
# kernels (what a step's walk adds up)
Priced = tuple[Operation, Cost, float]
# the names of the operations an engine fuses into a neighbouring kernel (an engine card's tuple, or
# the set its fusion passes add to it)
Fused = tuple[str, ...] | frozenset[str]
# a part's seconds, and its seconds per bound in order of first appearance, with some operations fused away
PartSums = tuple[float, tuple[tuple[Bound, float], ...]]


def _drop_older_half(table: dict[Any, Any]) -> None:
    """Make room in a table at its bound: drop its older half (dicts keep insertion order)."""
    for key in list(islice(table, len(table) // 2 or 1)):
        del table[key]


def operation_kernels(op: Operation) -> int:
    """Kernels one operation launches: its count, times the kernels its shape is made of (an
    elementwise shape of several kernels, a linear-attention phase's kernels)."""
    return op.count * getattr(op.shape, "kernels", 1)


class PricedPart:
    """A part of a plan (a tuple of operations one builder returned) priced on one (hardware card,
    tables) pair: each operation with its cost and seconds, the kernels it launches, and its sums.

    A part's sums are the one way a step adds up its operations: its operations' seconds in order
    (those an engine fuses away count 0), per part; the stage engine then adds the parts of a layer
    in order (infersim.engine.stage). Every path (a sweep row's time, the detailed result) takes
    them from here, so that they agree to the last bit whether or not the part was kept."""

    __slots__ = ("operations", "priced", "kernels", "_sums")

    def __init__(self, operations: Piece, priced: tuple[Priced, ...]) -> None:
        self.operations = operations  # held where kept by identity: the identity stays the part's
        self.priced = priced
        self.kernels = sum(map(operation_kernels, operations))
        self._sums: dict[Fused, PartSums] = {}

    def sums(self, fused: Fused) -> PartSums:
        """(seconds, seconds per bound) of the part with the operations named in `fused` taking
        none: kept per fused set (a tuple or frozenset: an engine card's, a fusion pass's)."""
        kept = self._sums.get(fused)
        if kept is None:
            kept = self._sums[fused] = _part_sums(self.priced, fused)
        return kept


def _part_sums(priced: tuple[Priced, ...], fused: Fused) -> PartSums:
    total = 0.0
    bounds: dict[Bound, float] = {}
    for op, cost, seconds in priced:
        if op.name in fused:
            seconds = 0.0
        total += seconds
        bound = cost.bound
        bounds[bound] = bounds.get(bound, 0.0) + seconds
    return total, tuple(bounds.items())


def priced_part(operations: Piece, hw: HardwareCard, tables: KernelTables) -> PricedPart:
    """`operations` priced without a memo."""
    priced = []
    for op in operations:
        cost = kernel_cost(op.shape, hw, tables)
        priced.append((op, cost, cost.seconds * op.count))
    return PricedPart(operations, tuple(priced))


class _PairCosts:
    """The costs kept for one (hardware card, tables) pair."""

    __slots__ = ("hw", "tables", "shapes", "parts")

    def __init__(self, hw: HardwareCard, tables: KernelTables) -> None:
        self.hw = hw  # held: the pair is keyed by these objects' identities
        self.tables = tables
        self.shapes: dict[AnyShape, Cost] = {}
        self.parts: dict[int, PricedPart] = {}  # id(part) -> the part priced (which holds the part)

    def priced(self, operations: Piece) -> PricedPart:
        """`operations` priced: kept by its identity, or priced now (part)."""
        return self.parts.get(id(operations)) or self.part(operations)

    def part(self, operations: Piece) -> PricedPart:
        """`operations` priced operation by operation, kept by its identity (the entry holds it)."""
        if len(self.parts) >= MAX_PIECES:
            _drop_older_half(self.parts)
        shapes = self.shapes
        priced = []
        for op in operations:
            shape = op.shape
            try:
                cost = shapes.get(shape)
            except TypeError:  # an unhashable shape: priced, not kept
                cost = kernel_cost(shape, self.hw, self.tables)
            if cost is None:
                if len(shapes) >= MAX_SHAPES:
                    _drop_older_half(shapes)
                cost = shapes[shape] = kernel_cost(shape, self.hw, self.tables)
            priced.append((op, cost, cost.seconds * op.count))
        entry = self.parts[id(operations)] = PricedPart(operations, tuple(priced))
        return entry


class PieceScope:
    """The pieces of the builders given the same leading arguments (a model card, and the record a
    builder is given of the deployment), each kept on (builder, its other arguments)."""

    __slots__ = ("leading", "pieces", "_memo")

    def __init__(self, leading: tuple[Hashable, ...], memo: PricingMemo) -> None:
        self.leading = leading
        self.pieces: dict[tuple[Hashable, ...], Piece] = {}
        self._memo = memo

    def piece(self, build: Callable[..., list[Operation]], *rest: Hashable) -> Piece:
        """build(*leading, *rest) as a tuple, kept under (build, *rest) in this scope: with the
        scope's leading arguments, every argument the builder is given is part of the key. The
        arguments must be hashable (frozen records, numbers, strings). A builder that raises is
        not kept (it raises again)."""
        key = (build, *rest)
        piece = self.pieces.get(key)
        if piece is None:
            piece = self.pieces[key] = tuple(build(*self.leading, *rest))
            self._memo.count_piece()
        return piece


class FreshPieces:
    """Pieces built afresh every time, for a caller without a memo (PieceScope's interface)."""

    __slots__ = ("leading",)

    def __init__(self, leading: tuple[Hashable, ...]) -> None:
        self.leading = leading

    def piece(self, build: Callable[..., list[Operation]], *rest: Hashable) -> Piece:
        return tuple(build(*self.leading, *rest))


def pieces_for(memo: PricingMemo | None, *leading: Hashable) -> PieceScope | FreshPieces:
    """Where the pieces of builders given `leading` first come from: `memo`'s scope of them, or
    fresh builds without a memo."""
    return FreshPieces(leading) if memo is None else memo.scope(*leading)


class PricingMemo:
    """Plan pieces and kernel costs kept for one owner (see the module's docstring)."""

    __slots__ = ("_scopes", "_recent_scopes", "_count", "_pairs", "_last_pair", "_derived")

    def __init__(self) -> None:
        self._scopes: dict[tuple[Hashable, ...], PieceScope] = {}  # by the leading arguments' values
        # by the leading arguments' identities: (those arguments, held; their scope)
        self._recent_scopes: dict[tuple[int, ...], tuple[tuple[Hashable, ...], PieceScope]] = {}
        self._count = 0  # pieces kept over all scopes
        self._pairs: dict[tuple[int, int], _PairCosts] = {}
        self._last_pair: _PairCosts | None = None
        # (make, *identities of the sources) -> (the sources, held: their identities stay theirs; what was made)
        self._derived: dict[tuple[Any, ...], tuple[tuple[object, ...], Any]] = {}

    def derived(self, make: Callable[..., T], *sources: object) -> T:
        """make(self, *sources), kept for the last RECENT_SCOPES source objects `make` was given (by
        identity; each entry holds its sources): a sweep's plans come from a few model cards and
        deployment objects at a time, and what is made of them (the records their builders are
        given, the scopes of their pieces) is then made once, not once per plan."""
        key = (make, *map(id, sources))
        kept = self._derived.get(key)
        if kept is not None:
            return kept[1]
        value = make(self, *sources)
        if len(self._derived) >= RECENT_SCOPES:
            _drop_older_half(self._derived)
        self._derived[key] = (sources, value)
        return value

    def scope(self, *leading: Hashable) -> PieceScope:
        """The scope of the pieces whose builders are given `leading` first: one per value of the
        leading arguments (equal cards and records share it, however many objects carry them).
        The scopes asked for lately are found by the identities of those objects, without hashing
        them: a sweep's consecutive plans mostly come from the same ones."""
        ids = tuple(map(id, leading))
        recent = self._recent_scopes.get(ids)
        if recent is not None:
            return recent[1]
        scope = self._scopes.get(leading)
        if scope is None:
            if len(self._scopes) >= MAX_PIECES:  # scopes of builders that raised hold no piece
                _drop_older_half(self._scopes)
                self._forget_dropped_scopes()
            scope = self._scopes[leading] = PieceScope(leading, self)
        if len(self._recent_scopes) >= RECENT_SCOPES:
            _drop_older_half(self._recent_scopes)
        self._recent_scopes[ids] = (leading, scope)  # these objects are held: their identities stay theirs
        return scope

    def count_piece(self) -> None:
        """One more piece kept; at MAX_PIECES every scope drops its older half (and the scopes left
        empty go)."""
        self._count += 1
        if self._count < MAX_PIECES:
            return
        for scope in self._scopes.values():
            _drop_older_half(scope.pieces)
        self._scopes = {leading: scope for leading, scope in self._scopes.items() if scope.pieces}
        self._forget_dropped_scopes()

    def _forget_dropped_scopes(self) -> None:
        """After scopes were dropped: no other table may hand them out any more, and the count is
        the pieces of the scopes left."""
        self._recent_scopes.clear()
        self._derived.clear()
        self._count = sum(len(scope.pieces) for scope in self._scopes.values())

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

    def part(self, operations: Piece, hw: HardwareCard, tables: KernelTables) -> PricedPart:
        """`operations` (a part of a plan) priced on (hw, tables): each part once per pair, by its
        identity (the entry holding it), each kernel shape once per pair."""
        return self.pricer(hw, tables)(operations)

    def pricer(self, hw: HardwareCard, tables: KernelTables) -> Callable[[Piece], PricedPart]:
        """What prices a part on (hw, tables) as `part` does, for a caller that prices several (a
        step's walk): the pair's costs found once."""
        pair = self._last_pair
        if pair is None or pair.hw is not hw or pair.tables is not tables:
            pair = self._pair(hw, tables)
        return pair.priced

    def sizes(self) -> dict[str, int]:
        """Entries kept in each table: pieces (over all scopes), scopes, (card, tables) pairs, and
        over all pairs the shape costs and the priced pieces."""
        pairs = self._pairs.values()
        return {"pieces": self._count, "scopes": len(self._scopes), "pairs": len(self._pairs),
                "shapes": sum(len(p.shapes) for p in pairs), "priced": sum(len(p.parts) for p in pairs)}
