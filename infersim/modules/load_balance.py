"""Expert-load balance under expert parallelism: how much more the most loaded EP rank carries.

With EP every MoE layer waits for its most loaded GPU. `moe_balance` returns the factors the FFN
module applies, pure functions of the layout and the stage's batch: closed form for even
long-run traffic (the default), and for a skewed dataset one seeded sampling of placements per
layout, done once and cached; every run gives the same number:

- `token_factor` = expected token-expert pairs on the most loaded GPU / the mean over GPUs.
  It scales the routed tokens of that GPU's grouped GEMMs (compute and activation bytes; a
  balanced-load MFU table is looked up at that GPU's token count) and the tokens that GPU
  receives in dispatch and sends back in combine.
- `active_experts` = expected distinct experts (slots) the most loaded GPU activates, i.e. whose
  weights it reads. In memory-bound decode the straggler is the GPU with the most *distinct
  activated experts*, not the most tokens (arXiv 2512.09277, `moe_load.md`); both maxima are
  applied together (an upper bound on the straggler: exact when one term dominates its kernel).

Policies (`deployment.moe.load_balance`):

ideal
    Factor 1: tokens spread evenly over the experts' GPUs (the original InferSim assumption).

statistical (default)
    Routing is random. Averaged over many sequences the routed load is uniform over experts
    (what the routers are trained for: DeepSeek-V3's auxiliary-loss-free bias balancing,
    Qwen3's global-batch balance loss), but tokens of one sequence are not independent: each
    sequence prefers its own experts. A sequence's expert popularity follows aiconfigurator's
    power-law routing model (ai-dynamo/aiconfigurator, `_generate_power_law_distribution`):
    per-expert load proportional to x drawn from a density ~ x^-alpha on [1, R], normalised to
    top-k routed experts per token, each expert picked at most once per token (q_e <= 1), the hot
    experts landing on random GPUs. alpha = `deployment.moe.routing_skew`, default 1.01,
    aiconfigurator's value for the DeepSeek and Kimi families (it uses 1.2 for other MoE models).
    R = 0.8 x 1024 (`POPULARITY_RANGE`): aiconfigurator's range [1, 0.8 x tokens] at 1024 tokens,
    the per-rank batch of TensorRT-LLM's wide-EP measurement; fixed here so that popularity is a
    property of the traffic, not of the batch size.

    The long-run popularity of the served traffic can be skewed too (`deployment.moe.dataset_skew`,
    the same power law, default null = even): a narrow dataset keeps the same experts hot
    (TensorRT-LLM measured max/mean 2.56 without EPLB at EP32 on machine-translation data).

    A GPU holding E/P of the E experts (P = EP size) then receives, for N tokens routed over the
    EP group from sequences of L tokens each, pairs with mean mu = N k / P and, around the share
    of the long-run popularity it holds, a variance

        var = N [ v_tok + (L_w - 1) v_seq ]
        v_tok = k (1/P)(1 - 1/P)(E - k)/(E - 1)     one token's k distinct experts (hypergeometric)
        v_seq = s^2 (sum_j w_j^2 - (sum_j w_j)^2 / E) E / (E - 1)
                the covariance of two tokens of one sequence: the variance, over random
                placements of the sequence's hot experts, of the popularity share the GPU holds
                (s^2 the variance of the sequence's q_e over experts; w_j = 1 / replicas of each
                of the GPU's slots' experts, 1 without EPLB)

    with L_w the token-weighted mean sequence length in the batch (decode: tokens per request per
    step, 1 without speculation, so decode keeps only the multinomial noise of independent
    tokens). The expected maximum of P exchangeable loads with a fixed sum (correlation -1/(P-1))
    is mu + z_P sqrt(P/(P-1)) sqrt(var), z_P the expected maximum of P independent standard
    normals. So

        token_factor = min(F + z_P sqrt(P/(P-1)) sqrt(var) / mu,  P min(k, slots per GPU) / k)

    where F is the fullest GPU's long-run share over the mean (1 for even traffic; with a skewed
    dataset the mean over PLACEMENT_SAMPLES seeded random placements, computed once and cached)
    and the cap says that one token sends at most min(k, slots per GPU) pairs to one GPU. The
    factor is >= 1, falls like 1/sqrt(tokens per rank) and tends to F (1 for even traffic) as they
    grow. For independent tokens (L = 1) and even traffic it is the multinomial noise alone,
    1 + z_P sqrt((E - k) / (T k (E - 1))) for T tokens per rank, which reproduces `moe_load.md`'s
    multinomial simulation (max/mean 1.09/1.26/1.42 at EP8/32/64 for 256 tokens of top-8 of 256
    experts; 1.01/1.03/1.05 for 16,384). With dataset_skew 1.01 at EP32 and 1024 tokens per rank
    it gives 2.36 to 2.44 (sequences of 1 to 256 tokens), against TensorRT-LLM's measured 2.56 (aiconfigurator's own sampled power
    law gives 2.3 to 2.9 there).

eplb (with `deployment.moe.redundant_experts` R >= 0)
    DeepSeek's EPLB (deepseek-ai/EPLB, global policy) on E + R slots: each redundant slot goes to
    the expert with the highest load per replica, then replicas are packed heaviest first onto the
    lightest GPU with a free slot; an expert's tokens split evenly over its replicas. The
    placement is computed from observed statistics, i.e. the long-run popularity, not today's
    batch: F is then the fullest GPU's long-run share of that placement (slot granularity: 256
    experts + 32 redundant on EP72 leave some GPU 4 whole experts, F = 4 / 3.56 = 1.125), and
    each sequence's hot experts are new to it, so v_seq stays, with the fullest GPU's weights w_j
    (replicas spread a hot expert over GPUs). So eplb <= statistical where the slots leave room to
    balance, and eplb > 1: TensorRT-LLM measured 1.11 with EPLB at EP32 x 9 slots and 1.115 at
    EP36 x 8 (the model, dataset skew 1.01: 1.02 to 1.10 for sequences of 1 to 256 tokens).

Not modelled: layers whose hot experts differ (one exponent for all layers); a placement that
lags a drifting dataset; EPLB's hierarchical (node-first) policy; the extra activation memory of
the most loaded rank; node-level (rather than GPU-level) imbalance of inter-node traffic, which
is smaller (the GPU factor is applied to both links, an upper bound).

Measured tables: a grouped-GEMM table measured under balanced routing (the imported InferSim
tables) is looked up at the most loaded GPU's token count, which the shape carries. Tables
whose kernels were measured under imbalanced routing (aiconfigurator's, which time the most
loaded rank of a power-law routing) must not get the factor twice: `GroupedGemmShape.balanced()`
is the same kernel at the mean load, for table code that knows its measurements include it.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from infersim.base.records import cheap_init

Policy = Literal["ideal", "statistical", "eplb"]

# aiconfigurator (ai-dynamo/aiconfigurator collector, `_generate_power_law_distribution`): the
# per-expert load is drawn from x^-alpha on [1, 0.8 x num_tokens]; fixed at the 1024 tokens per
# rank of TensorRT-LLM's wide-EP measurement (moe_load.md) so popularity does not grow with batch.
POPULARITY_RANGE = 0.8 * 1024
# aiconfigurator's alpha for the DeepSeek and Kimi families (moe_load.md); 1.2 for other MoE models.
DEFAULT_ROUTING_SKEW = 1.01
# random placements averaged for the fullest GPU's share of a skewed long-run popularity (a
# sampling error of about 1% of the excess over 1 at EP32; deterministic through the seed)
PLACEMENT_SAMPLES = 256
PLACEMENT_SEED = 0


@cheap_init
@dataclass(frozen=True, slots=True)
class MoeBalance:
    """Load of the most loaded EP rank of one MoE layer, relative to the mean rank."""

    policy: Policy
    token_factor: float  # max / mean token-expert pairs per GPU (>= 1)
    active_experts: float  # expected distinct slots the most loaded GPU activates (weights read)
    mean_active_experts: float  # the same for a GPU of mean load
    tokens_per_rank: float  # routed tokens (before top-k) per EP rank, mean
    ep: int
    experts: int
    slots: int  # experts + redundant experts
    topk: int
    routing_skew: float
    dataset_skew: float | None  # long-run popularity exponent (None: even long-run load)
    sequence_length: float  # token-weighted mean tokens per sequence in the batch
    placement_factor: float = 1.0  # F: the fullest GPU's long-run share / mean (random or EPLB placement)

    @property
    def weight_factor(self) -> float:
        return self.active_experts / self.mean_active_experts if self.mean_active_experts > 0 else 1.0

    def describe(self) -> str:
        if self.policy == "ideal":
            return "ideal (even load, factor 1)"
        redundant = self.slots - self.experts
        how = (f"eplb, {self.experts} experts + {redundant} redundant = {self.slots} slots"
               if self.policy == "eplb" else "statistical")
        return (f"{how}: most loaded EP rank x{self.token_factor:.3f} tokens, "
                f"{self.active_experts:.1f} of {self.slots // self.ep} experts read "
                f"({self.tokens_per_rank:,.0f} tokens per rank, EP{self.ep}, routing skew {self.routing_skew:g}"
                + (f", dataset skew {self.dataset_skew:g}" if self.dataset_skew is not None else "") + ")")

    def derivation(self) -> str:
        if self.policy == "ideal":
            return "load_balance: ideal assumes every EP rank carries the mean load"
        return (f"{self.placement_factor:.3f} (fullest GPU's long-run share / mean"
                + (", EPLB placement" if self.policy == "eplb" else "") + ") "
                + "+ z_P sqrt(P/(P-1)) sqrt(N (v_tok + (L-1) v_seq)) / (N k / P) with P = "
                f"{self.ep}, "
                f"N = {self.tokens_per_rank * self.ep:,.0f} tokens routed over the EP group, k = {self.topk}, "
                f"L = {self.sequence_length:,.0f} tokens per sequence, per-sequence power-law popularity "
                f"alpha = {self.routing_skew:g} on [1, {POPULARITY_RANGE:g}], long-run popularity "
                + (f"alpha = {self.dataset_skew:g}" if self.dataset_skew is not None else "even")
                + " (see infersim/modules/load_balance.py)")


# The lru_cache'd functions below are pure functions of a few plain numbers (keyed by every
# argument, bounded), costly to evaluate (an integration, sampled placements) and asked the same
# few questions by every plan of a run: they hold no card, plan or cost, so no run's state.
#: Simpson's rule for expected_max_normal: the range of x, and its number of steps
_NORMAL_RANGE, _NORMAL_STEPS = (-9.0, 9.0), 3600


@lru_cache(maxsize=1)
def _normal_samples() -> tuple[float, tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """(the step h, and at each of the steps + 1 points: Simpson's weight x x, phi(x), Phi(x)): what
    expected_max_normal integrates, whatever n (a layout search asks for each new EP size at the
    rate of its first configurations)."""
    (lo, hi), steps = _NORMAL_RANGE, _NORMAL_STEPS
    h = (hi - lo) / steps
    exp, erf = math.exp, math.erf
    root_two_pi, root_two = math.sqrt(2 * math.pi), math.sqrt(2.0)
    xs = [lo + i * h for i in range(steps + 1)]
    weighted = [(4 if i % 2 else 2) * x for i, x in enumerate(xs)]
    weighted[0], weighted[-1] = xs[0], xs[-1]  # the end points weigh 1
    return (h, tuple(weighted), tuple([exp(-0.5 * x * x) / root_two_pi for x in xs]),
            tuple([0.5 * (1.0 + erf(x / root_two)) for x in xs]))


@lru_cache(maxsize=1024)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for n = 1), by Simpson integration of
    x n phi(x) Phi(x)^(n-1)."""
    if n <= 1:
        return 0.0
    h, weighted, phi, cdf = _normal_samples()
    power = n - 1
    total = 0.0
    for weight_x, density, cumulative in zip(weighted, phi, cdf):
        total += weight_x * n * density * cumulative ** power
    return total * h / 3.0


@lru_cache(maxsize=1024)
def popularity(num_experts: int, topk: int, alpha: float) -> tuple[float, ...]:
    """Routing probability of each expert for one sequence (sum = topk, each <= 1), largest first:
    the power law x^-alpha on [1, POPULARITY_RANGE] at the quantiles (i - 1/2) / E."""
    R = POPULARITY_RANGE
    xs = []
    for i in range(num_experts):
        u = 1.0 - (i + 0.5) / num_experts
        if alpha == 0:
            x = 1.0 + (R - 1.0) * u
        elif abs(alpha - 1.0) < 1e-12:
            x = R ** u
        else:
            a = 1.0 - alpha
            x = ((R ** a - 1.0) * u + 1.0) ** (1.0 / a)
        xs.append(x)
    total = sum(xs)
    q = [topk * x / total for x in xs]
    for _ in range(num_experts):  # an expert is picked at most once per token: cap at 1, spread the rest
        excess = sum(v - 1.0 for v in q if v > 1.0)
        if excess <= 1e-12:
            break
        free = sum(v for v in q if v < 1.0)
        q = [1.0 if v >= 1.0 else v + excess * v / free for v in q]
    return tuple(q)


def _variance(values: tuple[float, ...]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


@lru_cache(maxsize=1024)
def popularity_variance(num_experts: int, topk: int, alpha: float | None) -> float:
    """Variance over experts of the routing probabilities (0 for alpha None: even popularity)."""
    return 0.0 if alpha is None else _variance(popularity(num_experts, topk, alpha))


@lru_cache(maxsize=1024)
def eplb_placement(loads: tuple[float, ...], slots: int, ep: int) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """DeepSeek EPLB, global policy (deepseek-ai/EPLB): replicas per expert, and the experts on
    each GPU (one entry per slot). Each of the slots - E redundant slots goes to the expert with
    the highest load per replica (ties: lowest index); replicas are packed heaviest first onto the
    lightest GPU that has a free slot (ties: lowest GPU index)."""
    E = len(loads)
    replicas = [1] * E
    heap = [(-load, e) for e, load in enumerate(loads)]
    heapq.heapify(heap)
    for _ in range(slots - E):
        _, e = heapq.heappop(heap)
        replicas[e] += 1
        heapq.heappush(heap, (-loads[e] / replicas[e], e))
    items = sorted(((loads[e] / replicas[e], e) for e in range(E) for _ in range(replicas[e])), key=lambda t: (-t[0], t[1]))
    per_gpu = slots // ep
    gpus: list[list[int]] = [[] for _ in range(ep)]
    free = [(0.0, g) for g in range(ep)]
    heapq.heapify(free)
    for load, e in items:
        total, g = heapq.heappop(free)
        gpus[g].append(e)
        if len(gpus[g]) < per_gpu:
            heapq.heappush(free, (total + load, g))
    return tuple(replicas), tuple(tuple(g) for g in gpus)


def _max_active(slots_per_gpu: int, hit: float, ep: int) -> tuple[float, float]:
    """(mean, expected max over ep GPUs) of the distinct slots a GPU activates, each of its
    slots hit independently with probability `hit`."""
    mean = slots_per_gpu * hit
    spread = expected_max_normal(ep) * math.sqrt(slots_per_gpu * hit * (1.0 - hit))
    return mean, min(float(slots_per_gpu), mean + spread)


def moe_balance(policy: Policy, num_experts: int, topk: int, ep: int, tokens_per_rank: float,
                sequence_length: float = 1.0, redundant_experts: int = 0,
                routing_skew: float = DEFAULT_ROUTING_SKEW, dataset_skew: float | None = None) -> MoeBalance:
    """Imbalance of one MoE layer (see the module docstring). tokens_per_rank: tokens whose routing
    each EP rank contributes (the routing domain is tokens_per_rank x ep); sequence_length: the
    token-weighted mean tokens per sequence among them; dataset_skew: power-law exponent of the
    long-run expert popularity (None: even long-run load)."""
    E, k, P = num_experts, topk, ep
    S = E + redundant_experts
    per_gpu = S // P
    N = tokens_per_rank * P
    L = max(1.0, min(sequence_length, N))  # a sequence is at most the whole batch
    # a slot is hit by a token with probability ~ k/S (replicas share their expert's tokens)
    hit = 1.0 - (1.0 - k / E) ** (N * E / S) if N > 0 else 0.0
    mean_active = per_gpu * hit
    base: dict[str, Any] = dict(ep=P, experts=E, slots=S, topk=k, routing_skew=routing_skew, dataset_skew=dataset_skew,
                sequence_length=L, tokens_per_rank=tokens_per_rank, mean_active_experts=mean_active)
    if policy == "ideal" or P <= 1 or N <= 0:
        return MoeBalance(policy=policy, token_factor=1.0, active_experts=mean_active, **base)
    s2_seq = popularity_variance(E, k, routing_skew)
    if policy == "eplb":
        # placed from the long-run statistics: that share is known, only its granularity remains
        placement, sum_w, sum_w2 = _eplb_fullest_gpu(E, k, S, P, dataset_skew)
    else:
        # contiguous blocks of E/P experts; which experts are hot is random with respect to them
        placement = random_placement_floor(E, k, P, dataset_skew)
        sum_w = sum_w2 = E / P
    v_tok = k * (1.0 / P) * (1.0 - 1.0 / P) * (E - k) / (E - 1) if E > 1 else 0.0
    v_seq = _placement_variance(s2_seq, sum_w, sum_w2, E)
    mu = N * k / P
    z = expected_max_normal(P) * math.sqrt(P / (P - 1))
    factor = placement + z * math.sqrt(N * (v_tok + (L - 1.0) * v_seq)) / mu
    factor = max(1.0, min(factor, P * min(k, per_gpu) / k))
    _, max_active = _max_active(per_gpu, hit, P)
    return MoeBalance(policy=policy, token_factor=factor, active_experts=max_active, placement_factor=placement, **base)


@lru_cache(maxsize=1024)
def random_placement_floor(E: int, k: int, ep: int, dataset_skew: float | None) -> float:
    """Expected long-run share of the fullest GPU over the mean when E/ep experts of popularity
    `dataset_skew` sit on each GPU in blocks unrelated to their popularity: 1 for even popularity;
    otherwise the mean over PLACEMENT_SAMPLES random assignments (seed PLACEMENT_SEED; computed
    once per layout and cached, so every run gives the same number)."""
    if dataset_skew is None or ep <= 1:
        return 1.0
    q = popularity(E, k, dataset_skew)
    rng = random.Random(PLACEMENT_SEED)
    order = list(range(E))
    per = E // ep
    total = 0.0
    for _ in range(PLACEMENT_SAMPLES):
        rng.shuffle(order)
        total += max(sum(q[e] for e in order[g * per:(g + 1) * per]) for g in range(ep))
    return max(1.0, total / PLACEMENT_SAMPLES / (k / ep))


@lru_cache(maxsize=1024)
def _eplb_fullest_gpu(E: int, k: int, slots: int, ep: int, dataset_skew: float | None) -> tuple[float, float, float]:
    """EPLB placed from the long-run popularity: (the fullest GPU's long-run share / the mean,
    sum and sum of squares of its slot weights w_j = 1 / replicas)."""
    long_run = popularity(E, k, dataset_skew) if dataset_skew is not None else tuple(k / E for _ in range(E))
    replicas, gpus = eplb_placement(long_run, slots, ep)
    shares = [sum(long_run[e] / replicas[e] for e in gpu) for gpu in gpus]
    heaviest = max(range(ep), key=lambda g: shares[g])
    weights: dict[int, float] = {}
    for e in gpus[heaviest]:
        weights[e] = weights.get(e, 0.0) + 1.0 / replicas[e]
    return (shares[heaviest] / (k / ep), sum(weights.values()), sum(w * w for w in weights.values()))


def _placement_variance(s2: float, sum_w: float, sum_w2: float, num_experts: int) -> float:
    """Variance of sum_j w_j q_pi(j) over random assignments pi of E popularity values (variance
    s2) to the weighted slots of one GPU (sampling without replacement)."""
    E = num_experts
    if E <= 1:
        return 0.0
    return max(0.0, s2 * (sum_w2 - sum_w * sum_w / E) * E / (E - 1))
