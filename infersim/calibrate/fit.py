"""Maximum a posteriori fit of a few card constants to measured latencies (pure Python, no numpy).

Each measured point i (one experiment's stage and metric) gives a residual
r_i = ln(predicted_i / measured_i). A constant j is moved in its own coordinate u_j (ln of a
multiplier, or seconds as is) from its card value u0_j, which is also its prior mean with width
prior_sd_j. The fit minimises

    sum_i w_i huber(r_i(u)) / noise_i^2 + sum_j ((u_j - u0_j) / prior_sd_j)^2

by Gauss-Newton with a finite-difference Jacobian (the simulator is a program, not a formula), the
Huber loss (quadratic within `huber` of zero, linear beyond) keeping one overloaded run from pulling
every constant. `noise_i` is the scatter a mean latency has between repeated runs and from what
the simulator does not model (NOISE_BY_METRIC): a constant that the data cannot pin down better than
that stays at its card. w_i gives each experiment the same weight (its points share it).

Identifiability: with the Jacobian J, the posterior covariance is (J^T W J / s + diag(1 / prior_sd^2))^-1,
where s >= 1 says how much more the residuals scatter than the noise: 1 at the cards (where the
residuals are what the constants are to explain), then the residuals' robust, median-based scale left
at the fit (_scatter), with which the constants are checked and, if one goes, fitted again. A constant is fitted only when its posterior sd is at
most `min_shrink` of its prior sd (the data halve its uncertainty), and at most one constant per
experiment and per three measured points is fitted; the least determined ones are refused one at a
time (removing one can make its correlated partner determined), each with the reason.

Held-out gate: the constants so fitted are kept only if, held out (each experiment predicted by
the constants fitted without it, on the linearisation at the cards), no metric's median error is
worse than the cards' and the mean errors are lower; else the constant whose absence leaves the
lowest held-out errors is refused, and so on (held_out_gate).

Held-out error: each experiment is left out in turn and the constants are refitted without it by
one Gauss-Newton step from the full fit's linearisation (J and residuals at the fitted constants,
the experiment's rows removed); the left-out experiment is then simulated at those constants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from infersim.base.errors import InferSimError, NotPossible
from infersim.base.stats import percentile
from infersim.cards.calibration import Constant

# (constant values by name, experiment index) -> (stage, metric) -> predicted value
Predict = Callable[[Mapping[str, float], int], Mapping[tuple[str, str], float]]


@dataclass(frozen=True)
class Observation:
    experiment: int
    stage: str
    metric: str
    measured: float


#: scatter of a measured stage mean around what the model can explain (ln units), per metric: a
#: stage's mean TTFT rests on tens of milliseconds that the arrival pattern moves (and a shortened
#: simulated stage averages fewer requests); ITL and E2E average hundreds of tokens per request;
#: a traced module's kernel time per step (kernel_ms) is measured to the microsecond, and scatters
#: around its family's scale by how far the kernel tables' shapes stand from the traced ones
NOISE_BY_METRIC = (("ttft_mean_ms", 0.15), ("itl_mean_ms", 0.05), ("e2e_mean_ms", 0.05), ("kernel_ms", 0.10))


@dataclass(frozen=True)
class FitSettings:
    noise: tuple[tuple[str, float], ...] = NOISE_BY_METRIC
    default_noise: float = 0.10  # a metric not listed in noise
    huber: float = 0.25  # residuals (ln units) beyond this count linearly
    min_shrink: float = 0.5  # fitted only if posterior sd <= this x prior sd
    iterations: int = 2  # Gauss-Newton steps, each with a fresh Jacobian
    weigh_experiments: bool = True  # each experiment's points together weigh as much as another's
    held_out_gate: bool = True  # keep a constant only where the fit with it improves every metric held out


@dataclass(frozen=True)
class ConstantFit:
    constant: Constant
    prior: float
    value: float
    sd: float  # posterior standard deviation, in the constant's units (delta method for multipliers)
    shrink: float  # posterior sd / prior sd


@dataclass(frozen=True)
class FitResult:
    fitted: tuple[ConstantFit, ...]
    refused: tuple[tuple[Constant, str], ...]
    observations: tuple[Observation, ...]
    before: tuple[float, ...]  # predicted at the cards
    after: tuple[float, ...]  # predicted at the fitted constants (in sample)
    held_out: tuple[float, ...] | None  # predicted with the point's experiment left out of the fit
    evaluations: int


# -- small dense linear algebra ---------------------------------------------------------------------


def _cholesky_solve(a: list[list[float]], b: list[float]) -> list[float]:
    n = len(a)
    low = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            s = a[i][j] - sum(low[i][k] * low[j][k] for k in range(j))
            if i == j:
                if s <= 0:
                    raise ArithmeticError("matrix not positive definite")
                low[i][i] = math.sqrt(s)
            else:
                low[i][j] = s / low[j][j]
    y = [0.0] * n
    for i in range(n):
        y[i] = (b[i] - sum(low[i][k] * y[k] for k in range(i))) / low[i][i]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (y[i] - sum(low[k][i] * x[k] for k in range(i + 1, n))) / low[i][i]
    return x


def _inverse(a: list[list[float]]) -> list[list[float]]:
    n = len(a)
    columns = [_cholesky_solve(a, [1.0 if i == j else 0.0 for i in range(n)]) for j in range(n)]
    return [[columns[j][i] for j in range(n)] for i in range(n)]


# -- the problem ------------------------------------------------------------------------------------


def _to_u(constant: Constant, value: float) -> float:
    return math.log(value) if constant.log else value


def _from_u(constant: Constant, u: float) -> float:
    return math.exp(u) if constant.log else u


def _bounds(constant: Constant) -> tuple[float, float]:
    return (math.log(constant.low), math.log(constant.high)) if constant.log else (constant.low, constant.high)


def _huber_weight(r: float, delta: float) -> float:
    return 1.0 if abs(r) <= delta else delta / abs(r)


def _huber(r: float, delta: float) -> float:
    return r * r if abs(r) <= delta else 2 * delta * abs(r) - delta * delta


class _Problem:
    """The observations, the constants' priors and a cached, counted simulator."""

    def __init__(self, constants: Sequence[Constant], priors: Mapping[str, float],
                 observations: Sequence[Observation], predict: Predict, settings: FitSettings) -> None:
        self.constants = tuple(constants)
        self.u0 = [_to_u(c, priors[c.name]) for c in self.constants]
        self.observations = tuple(observations)
        self.predict = predict
        self.settings = settings
        self.cache: dict[tuple[int, tuple[float, ...]], Mapping[tuple[str, str], float] | None] = {}
        self.evaluations = 0
        self.experiments = sorted({o.experiment for o in observations})
        by_metric = dict(settings.noise)
        self.noise = [by_metric.get(o.metric, settings.default_noise) for o in self.observations]
        # each experiment weighs the same: its points share one experiment's worth of weight (a run
        # measured at two load stages is one more run, not two; the held-out unit is the experiment)
        points = {k: sum(o.experiment == k for o in self.observations) for k in self.experiments}
        mean_points = len(self.observations) / max(1, len(self.experiments))
        self.weight = [mean_points / points[o.experiment] if settings.weigh_experiments else 1.0
                       for o in self.observations]
        self.scatter = 1.0  # the data's weight is divided by this: 1 (the stated noise), then the fit's (_scatter)

    def values(self, u: Sequence[float]) -> dict[str, float]:
        return {c.name: _from_u(c, x) for c, x in zip(self.constants, u)}

    def _experiment(self, u: Sequence[float], experiment: int) -> Mapping[tuple[str, str], float] | None:
        key = (experiment, tuple(round(x, 12) for x in u))
        if key not in self.cache:
            self.evaluations += 1
            try:
                self.cache[key] = self.predict(self.values(u), experiment)
            except NotPossible:
                self.cache[key] = None
        return self.cache[key]

    def predicted(self, u: Sequence[float], experiments: Sequence[int] | None = None) -> list[float | None]:
        wanted = set(self.experiments if experiments is None else experiments)
        runs = {k: self._experiment(u, k) for k in wanted}
        out: list[float | None] = []
        for o in self.observations:
            run = runs.get(o.experiment)
            out.append(None if run is None else run.get((o.stage, o.metric)))
        return out

    def residuals(self, u: Sequence[float]) -> list[float] | None:
        out = []
        for o, p in zip(self.observations, self.predicted(u)):
            if p is None or p <= 0:
                return None
            out.append(math.log(p / o.measured))
        return out

    def objective(self, u: Sequence[float], r: Sequence[float]) -> float:
        s = self.settings
        data = sum(w * _huber(x, s.huber) / sd ** 2 for x, sd, w in zip(r, self.noise, self.weight)) / self.scatter
        return data + sum(((x - x0) / c.prior_sd) ** 2 for x, x0, c in zip(u, self.u0, self.constants))

    def jacobian(self, u: list[float], r: Sequence[float], active: Sequence[int]) -> dict[int, list[float]]:
        """Column j of d r / d u_j, by a forward (or, at the top of the range, backward) difference
        of half a prior sd: wide enough to step over the serving simulator's step-cost grid."""
        columns: dict[int, list[float]] = {}
        for j in active:
            h = 0.5 * self.constants[j].prior_sd
            if u[j] + h > _bounds(self.constants[j])[1]:
                h = -h
            moved = list(u)
            moved[j] += h
            rm = self.residuals(moved)
            if rm is None:
                raise InferSimError(f"calibrate: the simulator could not run an experiment with "
                                    f"{self.constants[j].name} moved by {h:g}: the constants are outside what it "
                                    "can simulate")
            columns[j] = [(a - b) / h for a, b in zip(rm, r)]
        return columns


LINEAR_ITERATIONS = 6  # reweighted steps of a fit on the linearisation (the held-out gate)


# -- solving ----------------------------------------------------------------------------------------


def _normal_equations(p: _Problem, u: Sequence[float], r: Sequence[float], columns: Mapping[int, list[float]],
                      active: Sequence[int], rows: Sequence[int],
                      scatter: float | None = None) -> tuple[list[list[float]], list[float]]:
    """The Gauss-Newton system over `rows`, the data weighed down by `scatter` (see _scatter;
    default: the problem's current one)."""
    s = p.settings
    scale = p.scatter if scatter is None else scatter
    w = [p.weight[i] * _huber_weight(r[i], s.huber) / p.noise[i] ** 2 / scale for i in range(len(r))]
    a = [[sum(w[i] * columns[ja][i] * columns[jb][i] for i in rows) for jb in active] for ja in active]
    b = [-sum(w[i] * columns[ja][i] * r[i] for i in rows) for ja in active]
    for k, j in enumerate(active):
        prior = 1.0 / p.constants[j].prior_sd ** 2
        a[k][k] += prior
        b[k] -= (u[j] - p.u0[j]) * prior
    return a, b


def _select(p: _Problem, r: Sequence[float], columns: Mapping[int, list[float]],
            limit: int) -> tuple[list[int], list[tuple[int, str]]]:
    """The constants the data determine (see the module docstring), and why each other one is not."""
    rows = range(len(r))
    refused: list[tuple[int, str]] = []
    active = []
    for j, col in columns.items():
        if max((abs(x) for x in col), default=0.0) < 1e-6:
            refused.append((j, "no measured metric changes when it does (the runs do not exercise it)"))
        else:
            active.append(j)
    while active:
        a, _ = _normal_equations(p, p.u0, r, columns, active, rows)
        cov = _inverse(a)
        shrink = {j: math.sqrt(cov[k][k]) / p.constants[j].prior_sd for k, j in enumerate(active)}
        worst = max(active, key=lambda j: shrink[j])
        if shrink[worst] > p.settings.min_shrink:
            refused.append((worst, f"the data narrow its prior sd only to {shrink[worst]:.1%} (a fit needs "
                                   f"{p.settings.min_shrink:.0%} or less); kept at its card value"))
        elif len(active) > limit:
            refused.append((worst, f"more constants than the data determine: {limit} at most from "
                                   f"{len(p.experiments)} experiment(s) and {len(r)} points (one per experiment and "
                                   "per three points); it is the least determined"))
        else:
            break
        active.remove(worst)
    return active, refused


def _step(p: _Problem, u: list[float], r: list[float], columns: Mapping[int, list[float]], active: Sequence[int],
          rows: Sequence[int]) -> list[float]:
    a, b = _normal_equations(p, u, r, columns, active, rows)
    delta = _cholesky_solve(a, b)
    out = list(u)
    for k, j in enumerate(active):
        low, high = _bounds(p.constants[j])
        out[j] = min(high, max(low, u[j] + delta[k]))
    return out


def _descend(p: _Problem, u: list[float], r: list[float], active: Sequence[int]) -> tuple[list[float], list[float],
                                                                                         dict[int, list[float]]]:
    """Gauss-Newton iterations with step halving; (constants, residuals, Jacobian at the last linearisation)."""
    columns: dict[int, list[float]] = {}
    rows = range(len(r))
    for _ in range(max(1, p.settings.iterations)):
        columns = p.jacobian(u, r, active)
        current = p.objective(u, r)
        trial = _step(p, u, r, columns, active, rows)
        for _halving in range(4):
            rt = p.residuals(trial)
            if rt is not None and p.objective(trial, rt) < current:
                u, r = trial, rt
                break
            trial = [(a + b) / 2 for a, b in zip(u, trial)]
        else:
            break  # no step lowers the objective: at the minimum of what the grid resolves
    return u, r, columns


def _held_out(p: _Problem, u: list[float], r: list[float], columns: Mapping[int, list[float]],
              active: Sequence[int]) -> tuple[float, ...] | None:
    if len(p.experiments) < 2:
        return None
    out: list[float | None] = [None] * len(p.observations)
    for k in p.experiments:
        rows = [i for i, o in enumerate(p.observations) if o.experiment != k]
        uk = _step(p, u, r, columns, active, rows) if active else u
        for i, value in enumerate(p.predicted(uk, [k])):
            if p.observations[i].experiment == k:
                out[i] = value
    if any(v is None for v in out):
        return None
    return tuple(v for v in out if v is not None)


def _scatter(p: _Problem, r: Sequence[float]) -> float:
    """How much more the residuals scatter than `noise` says (at least 1): the square of the
    median |r_i| / noise_i over its value for normal scatter (0.6745), a scale that the few runs the
    Huber loss discounts do not set. The data's weight in the posterior is divided by it."""
    ratios = sorted(abs(x) / sd for x, sd in zip(r, p.noise))
    return max(1.0, (percentile(ratios, 50) / 0.6745) ** 2) if ratios else 1.0


def _covariance(p: _Problem, u: list[float], r: list[float], columns: Mapping[int, list[float]],
                active: Sequence[int]) -> list[list[float]]:
    """Posterior covariance at the fit, the data weighed by the scatter left at it."""
    a, _ = _normal_equations(p, u, r, columns, active, range(len(r)), _scatter(p, r))
    return _inverse(a)


def _fit_determined(p: _Problem, r0: list[float], cards_columns: Mapping[int, list[float]],
                    refused: list[tuple[int, str]]) -> tuple[list[int], list[float], list[float], dict[int, list[float]]]:
    """The constants the data determine, fitted: (active, constants, residuals, Jacobian at the last
    linearisation); `refused` gains each one dropped and why."""
    u0 = list(p.u0)
    limit = min(len(p.experiments), len(p.observations) // 3)
    active, why = _select(p, r0, cards_columns, limit)
    refused += why
    u, r, columns = _descend(p, u0, r0, active) if active else (u0, r0, {})
    for _recheck in range(3):
        if not active:
            break
        # the residuals left at the fit say how far the data scatter beyond the stated noise: the
        # constants are checked again with the data weighed by that, and fitted again if one goes
        p.scatter = _scatter(p, r)
        active, more = _select(p, r, {j: columns[j] for j in active}, limit)
        if not more:
            break
        refused += more
        if not active:
            return [], u0, r0, {}
        # from the fit so far, the refused constants back at their cards
        u = [x if j in active else x0 for j, (x, x0) in enumerate(zip(u, u0))]
        r = p.residuals(u) or r0
        u, r, columns = _descend(p, u if r is not r0 else u0, r, active)
    return active, u, r, columns


def fit_constants(constants: Sequence[Constant], priors: Mapping[str, float], observations: Sequence[Observation],
                  predict: Predict, settings: FitSettings | None = None) -> FitResult:
    """Fit what the observations determine of `constants` (priors: their card values)."""
    settings = settings or FitSettings()
    p = _Problem(constants, priors, observations, predict, settings)
    u0 = list(p.u0)
    r0 = p.residuals(u0)
    if r0 is None:
        raise NotPossible("calibrate: an experiment cannot be simulated at the cards' own values")
    cards_columns = p.jacobian(u0, r0, range(len(constants)))
    refused: list[tuple[int, str]] = []
    active, u, r, columns = _fit_determined(p, r0, cards_columns, refused)
    gated = bool(active) and settings.held_out_gate and len(p.experiments) >= 2
    if gated:
        kept, dropped = held_out_gate(p, r0, cards_columns, active)
        if dropped:
            refused += dropped
            active = kept
            u, r, columns = _descend(p, u0, r0, active) if active else (u0, r0, {})
    held_out = _held_out(p, u, r, columns, active)
    while gated and active and held_out is not None:
        worse = _worse_simulated(p, r0, held_out)
        if not worse:
            break
        # the linearisation passed a fit that the simulation, held out, finds worse than the cards:
        # the constant whose absence the linearisation ranks best goes, and the rest are fitted again
        drop = _least_useful(p, r0, cards_columns, active)[1]
        refused.append((drop, "held out (each experiment simulated with a fit without it), a fit with it predicts "
                              f"worse than the cards: {worse}; kept at its card value"))
        active = [j for j in active if j != drop]
        u, r, columns = _descend(p, u0, r0, active) if active else (u0, r0, {})
        held_out = _held_out(p, u, r, columns, active)
    cov = _covariance(p, u, r, columns, active) if active else []
    fitted = []
    for k, j in enumerate(active):
        c = p.constants[j]
        sd_u = math.sqrt(cov[k][k])
        value = _from_u(c, u[j])
        fitted.append(ConstantFit(c, priors[c.name], value, value * sd_u if c.log else sd_u, sd_u / c.prior_sd))
    before = tuple(float(x) for x in p.predicted(u0) if x is not None)
    after = tuple(float(x) for x in p.predicted(u) if x is not None)
    return FitResult(tuple(fitted), tuple((p.constants[j], why) for j, why in refused), p.observations,
                     before, after, held_out, p.evaluations)


# -- the held-out gate ------------------------------------------------------------------------------


def _linearised(p: _Problem, r0: Sequence[float], columns: Mapping[int, list[float]], u: Sequence[float],
                active: Sequence[int]) -> list[float]:
    return [r0[i] + sum(columns[j][i] * (u[j] - p.u0[j]) for j in active) for i in range(len(r0))]


def _linear_fit(p: _Problem, r0: list[float], columns: Mapping[int, list[float]], active: Sequence[int],
                rows: Sequence[int]) -> list[float]:
    """The constants fitted over `rows` on the linearisation at the cards (no simulation)."""
    u, r = list(p.u0), r0
    for _ in range(LINEAR_ITERATIONS):
        u = _step(p, u, r, columns, active, rows)
        r = _linearised(p, r0, columns, u, active)
    return u


@dataclass(frozen=True)
class _Errors:
    """Per metric, the median and the mean |predicted / measured - 1|."""

    median: dict[str, float]
    mean: dict[str, float]

    def no_worse_and_better(self, cards: _Errors) -> bool:
        """No metric's median error above the cards', and the mean errors together below theirs
        (the mean decides where the fit moves no point across the median)."""
        return (all(self.median[m] <= cards.median[m] for m in cards.median)
                and sum(self.mean.values()) < sum(cards.mean.values()))

    def total(self) -> float:
        return sum(self.median.values()) + sum(self.mean.values())


def _errors(p: _Problem, r: Sequence[float]) -> _Errors:
    by_metric: dict[str, list[float]] = {}
    for o, x in zip(p.observations, r):
        by_metric.setdefault(o.metric, []).append(abs(math.expm1(x)))
    return _Errors({m: percentile(sorted(v), 50) for m, v in by_metric.items()},
                   {m: sum(v) / len(v) for m, v in by_metric.items()})


def _linear_held_out(p: _Problem, r0: list[float], columns: Mapping[int, list[float]],
                     active: Sequence[int]) -> _Errors:
    """The errors with each experiment predicted by the (linearised) fit without it."""
    held = list(r0)
    for k in p.experiments if active else ():
        uk = _linear_fit(p, r0, columns, active, [i for i, o in enumerate(p.observations) if o.experiment != k])
        for i, x in enumerate(_linearised(p, r0, columns, uk, active)):
            if p.observations[i].experiment == k:
                held[i] = x
    return _errors(p, held)


def _worse_simulated(p: _Problem, r0: Sequence[float], held_out: Sequence[float]) -> str:
    """What the simulated held-out predictions do worse than the cards (as the gate judges: a
    metric's median error above the cards', or the mean errors together not below theirs), or ""."""
    if any(v <= 0 for v in held_out):
        return "a run held out is predicted to take no time"
    cards = _errors(p, r0)
    held = _errors(p, [math.log(v / o.measured) for v, o in zip(held_out, p.observations)])
    return "" if held.no_worse_and_better(cards) else _worse(held, cards, ".2%")


def _worse(held: _Errors, cards: _Errors, form: str = ".1%") -> str:
    """How held-out errors fall short of the cards': the metrics whose median is worse, else the
    mean errors summed over the metrics."""
    worse = [f"{m} {held.median[m]:{form}} against {cards.median[m]:{form}}" for m in cards.median
             if held.median[m] > cards.median[m]]
    return ", ".join(worse) or (f"mean errors {sum(held.mean.values()):.1%} against "
                                f"{sum(cards.mean.values()):.1%} summed over the metrics")


def _least_useful(p: _Problem, r0: list[float], columns: Mapping[int, list[float]],
                  active: Sequence[int]) -> tuple[_Errors, int]:
    """The constant whose absence leaves the lowest (linearised) held-out errors, with those errors."""
    trials = [(_linear_held_out(p, r0, columns, [x for x in active if x != j]), j) for j in active]
    return min(trials, key=lambda t: t[0].total())


def held_out_gate(p: _Problem, r0: list[float], columns: Mapping[int, list[float]],
                  active: Sequence[int]) -> tuple[list[int], list[tuple[int, str]]]:
    """Constants are dropped one at a time, the one whose absence leaves the lowest held-out errors
    first, until the fit predicts the held-out points better than the cards do: no metric's median
    error worse, the mean errors lower (or none is left). Held out on the linearisation at the
    cards, so it costs no simulation."""
    cards = _errors(p, r0)
    kept = list(active)
    refused: list[tuple[int, str]] = []
    held = _linear_held_out(p, r0, columns, kept)
    while kept and not held.no_worse_and_better(cards):
        without, drop = _least_useful(p, r0, columns, kept)
        refused.append((drop, "held out (each experiment predicted by a fit without it), a fit with it predicts "
                              f"worse than the cards: {_worse(held, cards)} on the cards; kept at its card value"))
        kept.remove(drop)
        held = without
    return kept, refused
