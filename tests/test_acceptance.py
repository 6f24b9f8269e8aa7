"""Stage rules with hand-made logits (+10 / -inf), so accept/reject outcomes are certain,
and the exact rule's losslessness by a chi-square test over many seeds."""

from __future__ import annotations

import numpy as np
import pytest
from lossless import chi_square_pvalue

from pyramid_gguf.decoding.runtime import verification as acceptance
from pyramid_gguf.decoding.runtime.verification import exact, fuzzy, greedy_match

V = 8
NEG = -np.inf


def peaked(*tokens: int) -> np.ndarray:
    """Rows of logits with +10 on one token and -inf elsewhere: ``[len(tokens), V]``."""
    z = np.full((len(tokens), V), NEG)
    z[np.arange(len(tokens)), tokens] = 10.0
    return z


def probs(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_exact_accepts_all_and_samples_bonus() -> None:
    y = np.array([1, 2, 3])
    p = probs(peaked(1, 2, 3, 5))
    q = probs(peaked(1, 2, 3))
    out = exact(y, p, q, rng())
    assert (out.n_accepted, out.token) == (3, 5)


def test_exact_rejects_at_first_disagreement_and_takes_residual() -> None:
    y = np.array([1, 2, 3])
    p = probs(peaked(1, 4, 3, 5))  # verifier wants 4 at position 1
    q = probs(peaked(1, 2, 3))
    out = exact(y, p, q, rng())
    assert (out.n_accepted, out.token) == (1, 4)


def test_residual_excludes_mass_the_proposer_already_covered() -> None:
    # p = 0.5/0.5 on tokens 0 and 1; q proposed token 0 with q(0) = 1: p(0)/q(0) = 0.5.
    p = np.zeros((2, V))
    p[0, [0, 1]] = 0.5
    p[1, 3] = 1.0
    q = np.zeros((1, V))
    q[0, 0] = 1.0
    seen = set()
    for s in range(200):
        out = exact(np.array([0]), p, q, rng(s))
        seen.add((out.n_accepted, out.token))
    # Rejection can only resample token 1 (residual max(0, p - q)); acceptance adds bonus 3.
    assert seen == {(0, 1), (1, 3)}


def test_exact_with_no_proposals_samples_the_verifier() -> None:
    out = exact(np.array([], dtype=int), probs(peaked(6)), np.zeros((0, V)), rng())
    assert (out.n_accepted, out.token) == (0, 6)


def test_fuzzy_negative_tau_is_exactly_exact() -> None:
    g = rng(7)
    for trial in range(50):
        k = 4
        zp = g.normal(size=(k + 1, V)) * 2
        zq = zp[:k] + g.normal(size=(k, V))
        p, q = probs(zp), probs(zq)
        y = np.array([g.choice(V, p=row) for row in q])
        a = exact(y, p, q, rng(trial))
        b = fuzzy(y, p, q, zp, zq, rng(trial), tau=-1.0)
        assert a == b


def test_fuzzy_large_tau_accepts_everything() -> None:
    y = np.array([1, 2, 3])
    zp = peaked(4, 4, 4, 5)  # the verifier disagrees everywhere
    zq = peaked(1, 2, 3)
    out = fuzzy(y, probs(zp), probs(zq), zp, zq, rng(), tau=10.0)
    assert (out.n_accepted, out.token) == (3, 5)


def test_fuzzy_threshold_separates_close_and_far_positions() -> None:
    y = np.array([1, 2])
    zq = np.zeros((2, V))
    zp = np.zeros((3, V))
    zp[1, 5] = 8.0  # position 1 is far from the proposer; position 0 identical
    p = probs(zp)
    q_peak = np.zeros((2, V))
    q_peak[np.arange(2), y] = 1.0  # proposer's warped q: it was sure of its tokens
    pure = fuzzy(y, p, q_peak, zp, zq, rng(), tau=0.05, variant="pure")
    assert pure.n_accepted == 1
    assert acceptance.js(zp[:2], zq)[0] == pytest.approx(0.0)
    assert acceptance.js(zp[:2], zq)[1] > 0.05


def test_fuzzy_without_proposer_logits_falls_back_to_exact() -> None:
    y = np.array([1])
    p = probs(peaked(4, 5))
    q = probs(peaked(1))
    out = fuzzy(y, p, q, np.log(p + 1e-30), None, rng(), tau=10.0)
    assert (out.n_accepted, out.token) == (0, 4)


def test_greedy_match_stops_at_first_mismatch() -> None:
    y = np.array([1, 2, 3])
    out = greedy_match(y, probs(peaked(1, 2, 7, 5)), rng())
    assert (out.n_accepted, out.token) == (2, 7)
    out = greedy_match(y, probs(peaked(1, 2, 3, 5)), rng())
    assert (out.n_accepted, out.token) == (3, 5)


def test_divergences_are_zero_on_equal_inputs_and_bounded() -> None:
    g = rng(3)
    a = g.normal(size=(5, V))
    b = g.normal(size=(5, V)) * 4
    for fn in (acceptance.js, acceptance.kl, acceptance.tv):
        assert np.allclose(fn(a, a), 0.0, atol=1e-12)
        assert (fn(a, b) > 0).all()
    assert (acceptance.js(a, b) <= np.log(2) + 1e-12).all()
    assert (acceptance.tv(a, b) <= 1.0).all()


def test_divergences_match_scipy() -> None:
    from scipy.spatial.distance import jensenshannon
    from scipy.stats import entropy

    g = rng(5)
    a = g.normal(size=(4, V)) * 3
    b = g.normal(size=(4, V)) * 3
    b[1, :] = -1e4  # a proposer certain of one token: zeros in q
    b[1, 7] = 10.0
    p, q = probs(a), probs(b)
    np.testing.assert_allclose(acceptance.js(a, b), jensenshannon(p, q, axis=1) ** 2, atol=1e-9)
    kl = acceptance.kl(a, b)  # from logits: finite where q underflows to 0 (scipy: inf)
    rows = [0, 2, 3]
    np.testing.assert_allclose(kl[rows], entropy(p[rows], q[rows], axis=1), rtol=1e-9)
    assert 1e3 < kl[1] < np.inf
    np.testing.assert_allclose(acceptance.tv(a, b), 0.5 * np.abs(p - q).sum(axis=1), atol=1e-12)


@pytest.mark.parametrize("k", [1, 3])
def test_exact_rule_output_is_distributed_as_the_verifier(k: int) -> None:
    """First emitted token of ``exact`` over many seeds ~ p_1, for fixed random p and q."""
    g = rng(42)
    p = probs(g.normal(size=(k + 1, V)) * 1.5)
    q = probs(g.normal(size=(k, V)) * 1.5)
    firsts = []
    for s in range(6000):
        r = rng(10_000 + s)
        y = np.array([r.choice(V, p=row) for row in q])
        out = exact(y, p, q, r)
        firsts.append(int(y[0]) if out.n_accepted > 0 else out.token)
    assert chi_square_pvalue(np.array(firsts), p[0]) > 0.001
    # The proposer's distribution is clearly different, so the test has power:
    assert chi_square_pvalue(np.array(firsts), q[0]) < 1e-6


def _fuzzy_every_row(
    y: np.ndarray,
    p: np.ndarray,
    q: np.ndarray,
    zp: np.ndarray,
    zq: np.ndarray,
    g: np.random.Generator,
    tau: float,
    divergence: str,
    variant: str,
) -> acceptance.StageOutcome:
    """The rule as docs/ALGORITHMS.md writes it: every position's divergence, then the rule."""
    k = len(y)
    u = g.random(k)
    close = acceptance.DIVERGENCE_FNS[divergence](zp[:k], zq) <= tau
    if variant == "pure":
        n = acceptance._first_false(close)
        return acceptance.StageOutcome(n, acceptance.sample(p[n], g))
    n = acceptance._first_false(close | acceptance._exact_accepts(y, p, q, u))
    return acceptance.StageOutcome(n, acceptance._residual_or_bonus(n, y, p, q, g))


@pytest.mark.parametrize("variant", ["reducible", "pure"])
@pytest.mark.parametrize("divergence", ["js", "kl", "tv"])
def test_fuzzy_scores_only_the_rows_that_decide_with_the_outcome_of_scoring_all(
    variant: str, divergence: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows: list[int] = []
    real = acceptance.DIVERGENCE_FNS[divergence]

    def counted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        rows.append(len(a))
        return real(a, b)

    g = rng(11)
    outcomes = set()
    for trial in range(300):
        k = int(g.integers(1, 7))
        zp = g.normal(size=(k + 1, V)) * 3
        zq = zp[:k] + g.normal(size=(k, V)) * g.choice([0.1, 1.0, 3.0])
        p, q = probs(zp), probs(zq)
        y = np.array([g.choice(V, p=row) for row in q])
        tau = float(g.choice([0.01, 0.05, 0.2]))
        want = _fuzzy_every_row(y, p, q, zp, zq, rng(trial), tau, divergence, variant)
        refused = int(np.sum(~acceptance._exact_accepts(y, p, q, rng(trial).random(k))))
        rows.clear()
        with monkeypatch.context() as m:
            m.setitem(acceptance.DIVERGENCE_FNS, divergence, counted)
            got = fuzzy(
                y, p, q, zp, zq, rng(trial), tau=tau, divergence=divergence, variant=variant
            )
        assert got == want
        assert all(r == 1 for r in rows)  # one row per call
        # reducible: only refused positions are scored; pure: at most up to the first far one
        assert len(rows) <= (refused if variant == "reducible" else got.n_accepted + 1)
        outcomes.add((got.n_accepted == k, got.n_accepted == 0))
    assert len(outcomes) == 3  # all kept, none kept and partial blocks were all exercised
