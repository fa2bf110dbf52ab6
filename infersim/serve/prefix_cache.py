"""One instance's prefix cache: a tree of token segments over paged KV blocks, evicted least recently used.

Requests carry token identity, not tokens: `segments`, a tuple of (key, length) naming the leading
parts of the prompt (system prompt k, session s's turn t question or answer); tokens past them are
the request's own. Two prompts hold the same token at a position when they name the same segments up
to it, so the cache is a tree whose nodes are segments (a node's key is its segment's key, its
position fixed by its ancestors) and whose edges never split: distinct segments differ from their
first token, as random prompts do.

KV is cached in blocks of `block_tokens` (vLLM: 16, its block hashes chained over full blocks;
SGLang: 1, its RadixCache keeps token granularity). A block is full when the sequence reaches its
end; it belongs to the node holding its last token (its content depends on every segment up to
there), so a node spanning tokens [a, b) owns floor(b / B) - floor(a / B) blocks, and a request finds
the blocks its segments share with cached ones, front to back, as vLLM's hash chain and SGLang's
match_prefix do; at most (prompt - 1) tokens, as both engines compute a prompt's last token.

A node's cached blocks are a prefix of its own: the first `gpu` on the GPU, the next `host` in the
host tier. Requests pin the nodes they use (reference counts); unpinned blocks stay cached and count
as free memory, and are evicted when the pool needs them: least recently used first, leaves first,
and a leaf's blocks from its end. That is vLLM's order (free blocks queue by the time their last
user freed them, a request's blocks tail first, so a prefix is evicted after every sequence that
extends it) and SGLang's (LRU over leaves, a node evicted whole; here a leaf is trimmed by the
blocks needed, a finer grain). With a host tier (an exclusive victim tier: vLLM's offloading
connector keeps what the GPU evicts) evicted blocks move to it, and it evicts its own leaves LRU.
What a request finds there is copied back before its prefill (the caller prices the copy).

Cost per request: a walk over its segments and O(log n) heap operations per node it pins, releases
or evicts, never a walk over its tokens. Stale heap entries are dropped when the heaps outgrow the
tree (twice its nodes).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import count

Segments = Sequence[tuple[Hashable, int]]


class Node:
    __slots__ = ("key", "parent", "children", "start", "end", "owned", "gpu", "host", "ref", "last", "alive",
                 "gpu_children", "live_children")

    def __init__(self, key: Hashable, parent: Node | None, start: int, end: int, block: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[Hashable, Node] = {}
        self.start = start
        self.end = end
        self.owned = end // block - start // block  # full blocks whose last token lies in [start, end)
        self.gpu = 0
        self.host = 0
        self.ref = 0
        self.last = 0.0
        self.alive = True
        self.gpu_children = 0  # children with GPU blocks
        self.live_children = 0  # children with blocks in either tier


@dataclass
class Match:
    """What a prompt finds: the nodes holding its cached blocks (front to back), and how many blocks
    are on the GPU and in the host tier (capped at the prompt's length - 1)."""

    path: list[Node]
    gpu_blocks: int
    host_blocks: int


class PrefixCache:
    def __init__(self, block_tokens: int, host_capacity_blocks: int = 0) -> None:
        self.block = block_tokens
        self.root = Node(None, None, 0, 0, block_tokens)
        self.gpu_blocks = 0  # cached on the GPU, pinned or not
        self.pinned_blocks = 0  # of which some running request uses
        self.host_blocks = 0
        self.host_capacity = host_capacity_blocks
        self.nodes = 0
        self.evicted_blocks = 0
        self._gpu_heap: list[tuple[float, int, Node]] = []
        self._host_heap: list[tuple[float, int, Node]] = []
        self._seq = count()

    @property
    def evictable_tokens(self) -> int:
        return (self.gpu_blocks - self.pinned_blocks) * self.block

    # -- lookups ---------------------------------------------------------------------------------

    def match(self, segments: Segments, prompt_tokens: int) -> Match:
        """The cached blocks `segments` lead to (read-only)."""
        cap = max(0, (prompt_tokens - 1) // self.block)
        node, path = self.root, []
        gpu = host = 0
        on_gpu = True
        for key, _length in segments:
            child = node.children.get(key)
            if child is None or gpu + host >= cap:
                break
            path.append(child)
            if on_gpu:
                gpu += child.gpu
                if child.gpu < child.owned:
                    on_gpu = False
                    host += child.host
            else:
                host += child.host
            if child.gpu + child.host < child.owned:
                break
            node = child
        if gpu + host > cap:
            host = max(0, min(host, cap - gpu))
            gpu = min(gpu, cap)
        _trim_path(path, gpu + host)
        return Match(path, gpu, host)

    def matched_tokens(self, segments: Segments, prompt_tokens: int) -> int:
        """Tokens of a prompt the cache holds (either tier), for cache-aware routing."""
        found = self.match(segments, prompt_tokens)
        return (found.gpu_blocks + found.host_blocks) * self.block

    # -- a request's life --------------------------------------------------------------------------

    def pin(self, found: Match, now: float) -> int:
        """A request admitted with `found`: pin its nodes and copy its host blocks back to the GPU.
        Returns the tokens this adds to the pool's use (blocks that were free or on the host)."""
        before = self.pinned_blocks
        for node in found.path:
            if node.ref == 0:
                self.pinned_blocks += node.gpu
            node.ref += 1
            node.last = now
        load = found.host_blocks
        for node in found.path:
            if load <= 0:
                break
            if node.host:
                moved = min(load, node.host)
                self._set(node, node.gpu + moved, node.host - moved)
                load -= moved
        return (self.pinned_blocks - before) * self.block

    def insert_prompt(self, found: Match, segments: Segments, prompt_tokens: int, own_key: Hashable,
                      now: float) -> tuple[list[Node], int]:
        """A request's prompt is in the KV cache: its blocks become cached, pinned by it. Returns the
        nodes it pins (for `release`) and the tokens moved from the request to the cache."""
        before = self.pinned_blocks
        path = list(found.path)
        node = self.root
        position = 0
        parts = list(segments)
        if prompt_tokens > sum(length for _key, length in parts):
            parts.append((own_key, prompt_tokens - sum(length for _key, length in parts)))
        for index, (key, length) in enumerate(parts):
            child = node.children.get(key)
            if child is None:
                child = self._child(node, key, position, position + length)
            position += length
            if index >= len(path):
                path.append(child)
                child.ref += 1
                if child.ref == 1:
                    self.pinned_blocks += child.gpu
            child.last = now
            if child.gpu < child.owned:
                self._set(child, child.owned, 0)
            node = child
        return path, (self.pinned_blocks - before) * self.block

    def release(self, path: list[Node], output_key: Hashable | None, output_tokens: int, now: float) -> int:
        """A request leaves: its output (when `output_key` is given) joins the cache after its prompt,
        unpinned; its nodes are unpinned. Returns the tokens no longer in use (still cached)."""
        before = self.pinned_blocks
        if output_key is not None and path and output_tokens > 0:
            last = path[-1]
            child = last.children.get(output_key)
            if child is None:
                child = self._child(last, output_key, last.end, last.end + output_tokens)
            child.last = now
            if child.gpu < child.owned:
                self._set(child, child.owned, 0)
            self._offer(child)
        for node in path:
            node.ref -= 1
            node.last = now
            if node.ref == 0:
                self.pinned_blocks -= node.gpu
                self._offer(node)
        return (before - self.pinned_blocks) * self.block

    # -- eviction ----------------------------------------------------------------------------------

    def fit(self, free_tokens: float) -> None:
        """Evict unpinned GPU blocks until they take at most `free_tokens` of the pool."""
        excess = self.gpu_blocks - self.pinned_blocks - int(max(0.0, free_tokens) // self.block)
        heap = self._gpu_heap
        while excess > 0 and heap:
            last, _seq, node = heapq.heappop(heap)
            if not (node.alive and node.ref == 0 and node.gpu > 0 and node.gpu_children == 0 and node.last == last):
                continue
            taken = min(excess, node.gpu)
            excess -= taken
            self.evicted_blocks += taken
            to_host = taken if self.host_capacity else 0
            self._set(node, node.gpu - taken, node.host + to_host)
            if node.gpu:
                heapq.heappush(heap, (node.last, next(self._seq), node))
        if self.host_blocks > self.host_capacity:
            self._fit_host()
        self._compact()

    def _fit_host(self) -> None:
        excess = self.host_blocks - self.host_capacity
        heap = self._host_heap
        while excess > 0 and heap:
            last, _seq, node = heapq.heappop(heap)
            if not (node.alive and node.host > 0 and node.live_children == 0 and node.last == last):
                continue
            taken = min(excess, node.host)
            excess -= taken
            self._set(node, node.gpu, node.host - taken)
            if node.host:
                heapq.heappush(heap, (node.last, next(self._seq), node))

    # -- bookkeeping -------------------------------------------------------------------------------

    def _child(self, parent: Node, key: Hashable, start: int, end: int) -> Node:
        child = Node(key, parent, start, end, self.block)
        parent.children[key] = child
        self.nodes += 1
        return child

    def _set(self, node: Node, gpu: int, host: int) -> None:
        """Change a node's cached blocks, keeping the totals, its parent's counts and the heaps."""
        parent = node.parent
        self.gpu_blocks += gpu - node.gpu
        self.host_blocks += host - node.host
        if node.ref:
            self.pinned_blocks += gpu - node.gpu
        if parent is not None and (gpu > 0) != (node.gpu > 0):
            parent.gpu_children += 1 if gpu > 0 else -1
            if gpu == 0:
                self._offer(parent)
        if parent is not None and (gpu + host > 0) != (node.gpu + node.host > 0):
            parent.live_children += 1 if gpu + host > 0 else -1
            if gpu + host == 0:
                self._offer(parent)
        moved_to_host = host > node.host
        node.gpu, node.host = gpu, host
        if moved_to_host:
            self._offer(node)
        if gpu + host == 0:
            self._prune(node)

    def _offer(self, node: Node) -> None:
        """Queue a node for eviction where it is now a leaf of either tier (it may not be)."""
        if not node.alive or node.parent is None:
            return
        if node.ref == 0 and node.gpu > 0 and node.gpu_children == 0:
            heapq.heappush(self._gpu_heap, (node.last, next(self._seq), node))
        if node.host > 0 and node.live_children == 0:
            heapq.heappush(self._host_heap, (node.last, next(self._seq), node))
        self._prune(node)

    def _prune(self, node: Node) -> None:
        """Drop empty, unpinned leaves (nothing cached, no children), and their emptied ancestors."""
        while (node.parent is not None and node.alive and not node.children and node.ref == 0
               and node.gpu + node.host == 0):
            node.alive = False
            parent = node.parent
            del parent.children[node.key]
            self.nodes -= 1
            node = parent

    def _compact(self) -> None:
        limit = 2 * self.nodes + 64
        if len(self._gpu_heap) > limit:
            self._gpu_heap = [e for e in self._gpu_heap if e[2].alive and e[2].ref == 0 and e[2].gpu > 0
                              and e[2].last == e[0]]
            heapq.heapify(self._gpu_heap)
        if len(self._host_heap) > limit:
            self._host_heap = [e for e in self._host_heap if e[2].alive and e[2].host > 0 and e[2].last == e[0]]
            heapq.heapify(self._host_heap)


def _trim_path(path: list[Node], blocks: int) -> None:
    """Keep the nodes up to the one holding the `blocks`-th cached block (and the block-less ones
    before it)."""
    seen = 0
    for index, node in enumerate(path):
        if seen >= blocks and node.owned:
            del path[index:]
            return
        seen += node.owned
