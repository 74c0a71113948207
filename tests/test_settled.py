"""Rounds that no proposer can win: `GammaController.settled` skips the pricing, and changes no decision."""

import copy
import random

from orchestrator.draft_pool import DraftPool
from orchestrator.generation import Generation
from orchestrator.request import GenerationRequest
from orchestrator.lookups import LOOKUP_KINDS
from specdec.core.params import SamplingParams
from specdec.core.rounds import ALPHA_MAX, AcceptanceEstimate, PassLoad, RoundRecord
from specdec.planning.controller import Ewma, GammaController
from specdec.planning.cost import CostProfile
from specdec.planning.prior import LookupPrior
from test_controller import STEP, flat, machine, pin_alpha


def loaded_controller(rng: random.Random) -> tuple[GammaController, dict[int, float]]:
    """A controller after a few target-only rounds under a random load, profile, network and α (pinned), and the
    α its session's proposers are priced at by the most tokens they propose (lookups may exceed the model's)."""
    knee = rng.choice([1, 2, 4, 9, 32])
    target = machine(STEP, knee) if knee < 32 else flat()
    draft = machine(STEP * rng.uniform(0.05, 0.6), knee=rng.choice([2, 4, 9]))
    alpha = rng.uniform(0.3, 0.99)
    ctl = pin_alpha(GammaController(8, target, draft, probe_every=rng.choice([4, 16, 64])), alpha)
    ctl.rtt_target.update(rng.uniform(0.0, 0.02))
    ctl.rtt_draft.update(rng.uniform(0.0, 0.02))
    ctl.contention_target.update(rng.uniform(1.0, 2.0))
    ctl.contention_draft.update(rng.uniform(1.0, 2.0))
    sessions = rng.choice([1, 2, 4, 8, 16])
    for _ in range(rng.randrange(1, 12)):
        rows = rng.uniform(1, sessions)
        compute = target.forward_s(rows) * rng.uniform(0.8, 1.5)
        load = PassLoad(sessions, rows, rows, compute)
        ctl.observe(RoundRecord(emitted=1, wall_s=compute + 0.002, target_wall_s=compute + 0.002,
                                target_compute_s=compute, target_load=load))
    ctl.choose(rng.randrange(0, 20))  # the last choice, which `settled` requires to be 0
    alphas = {8: max(alpha, rng.choice([alpha, rng.uniform(alpha, ALPHA_MAX)]))}
    if rng.random() < 0.5:
        alphas[rng.randrange(1, 4)] = ALPHA_MAX  # an untried lookup kind, tried short
    return ctl, alphas


def test_a_settled_round_is_one_that_choose_and_every_lookup_would_make_target_only():
    """Wherever `settled` holds, `choose` says 0 and is no probe, overlapped or not, whatever the draft's lag,
    and a free proposer at any α up to its highest loses to target-only at every γ up to its longest (a lookup
    is not proposed); and it does hold in some of these states (among them many sessions on a CPU-like
    profile), not in others."""
    rng, settled = random.Random(7), 0
    for case in range(400):
        ctl, alphas = loaded_controller(rng)
        cap = rng.randrange(1, 9)
        if not ctl.settled(cap, alphas):
            continue
        settled += 1
        for overlapping in (False, True):
            other = copy.deepcopy(ctl)
            other.overlapping = overlapping
            assert other.choose(cap, rng.randrange(1, 60)) == 0 and not other.probing, case
        for longest, highest in alphas.items():
            for alpha in (highest, rng.uniform(0.0, highest)):
                assert ctl.best_free(alpha, min(longest, cap))[0] == 0, case
    assert 40 < settled < 360, f"{settled} of 400 states settled"


def test_a_round_the_draft_model_cannot_win_for_its_catch_up_is_settled_and_choose_agrees():
    """With the draft model priced apart (`unseen`, `useful`: its catch-up, as `choose` prices it), wherever
    `settled` holds `choose` says 0 and is no probe, overlapped or not, at that lag or a longer one; and it holds in
    states that the model priced as a free proposer did not settle: on a flat (GPU-like) profile every γ of a free
    proposer wins, and only the draft's catch-up loses. A draft in step with the committed tokens (unseen 1) is
    settled no more often than as a free proposer."""
    rng, settled, newly = random.Random(11), 0, 0
    for case in range(400):
        ctl, _ = loaded_controller(rng)
        if rng.random() < 0.5:  # overlap at its cheapest: no slowdown, the bonus token always guessed
            ctl.contention_target, ctl.contention_draft = Ewma(0.3, 1.0), Ewma(0.3, 1.0)
            ctl.guesses.prior_alpha, ctl.guesses.prior_weight = ALPHA_MAX, 1e6
        useful = rng.randrange(1, 200)
        cap, unseen = min(useful, 8), rng.choice([1, 2, 30, 300, 3000])
        lookups = {rng.randrange(1, 4): rng.uniform(0.0, 0.5)} if rng.random() < 0.3 else {}
        if not ctl.settled(cap, lookups, unseen, useful):
            continue
        settled += 1
        newly += not ctl.settled(cap, lookups | {cap: max(lookups.get(cap, 0.0), ctl.acceptance.alpha)})
        for overlapping in (False, True):
            for lag in (unseen, unseen + rng.randrange(1, 100)):
                other = copy.deepcopy(ctl)
                other.overlapping = overlapping
                assert other.choose(useful, lag) == 0 and not other.probing, case
        if unseen == 1:
            assert ctl.settled(cap, lookups | {cap: ctl.acceptance.alpha}), case
    assert 40 < settled < 360 and newly > 5, (settled, newly)
    # Passes padded to one step, the draft's as the target's (scripts/pad_passes), the draft 300 tokens behind.
    padded = pin_alpha(GammaController(8, flat(), flat()), 0.7)
    assert padded.choose(60, 300) == 0 and padded.at_rest()
    assert padded.settled(8, {}, 300, 60) and not padded.settled(8, {8: 0.7}), "a free proposer at 0.7 would win"


# A verify of 2 or 3 tokens costs 2.2 or 3.3 steps, of 4 to 9 tokens 3.4 to 3.9: at α near 1 a proposal pays from
# 3 tokens on, at 0.6 never.
JUMP = CostProfile(tuple(STEP * x for x in (1.0, 2.2, 3.3, 3.4, 3.5, 3.6, 3.7, 3.8, 3.9)))


def test_settled_waits_for_a_due_probe_and_a_choice_of_zero_and_prices_each_proposer_up_to_its_length():
    """A controller whose every round is target-only by a wide margin (a verify of S tokens costs S steps) is
    settled between probes only: before its first `choose`, and when a probe is due, it is not. A proposer at α
    near 1 that proposes at most 2 tokens leaves it settled where one that proposes 3 does not."""
    ctl = pin_alpha(GammaController(8, machine(STEP, knee=1), flat(0.01), probe_every=4), 0.9)
    assert not ctl.at_rest() and not ctl.settled(8), "no choice yet"
    assert ctl.choose(8) == 0 and ctl.at_rest() and ctl.settled(8)
    for _ in range(4):
        ctl.observe(RoundRecord(emitted=1, target_wall_s=STEP, target_compute_s=STEP))
    assert not ctl.at_rest() and not ctl.settled(8)
    assert ctl.choose(8) > 0 and ctl.probing, "a due probe is choose's to make"
    assert ctl.settled(8) and not ctl.probing, "the round after a probe is settled, and not a probe"
    jump = pin_alpha(GammaController(8, JUMP, flat(0.01)), 0.6)
    assert jump.choose(8) == 0 and jump.settled(8, {8: 0.6, 2: ALPHA_MAX})
    assert jump.at_rest() and not jump.settled(8, {8: 0.6, 3: ALPHA_MAX}) and not jump.settled(8, {8: ALPHA_MAX})
    assert jump.settled(2, {8: ALPHA_MAX}), "no more than 2 tokens are of use"


def test_a_generation_is_settled_at_the_alpha_of_the_lookup_it_finds():
    """A generation asks `settled` at the draft model's α and at the α of the lookup it finds this round, if any (an
    untried kind's `ALPHA_MAX` for at most `UNTRIED_TOKENS`): a kind learned at α 0.99 unsettles the rounds that
    find it and no other. Not at all while a client's prediction is untried, nor under a fixed γ."""
    ctl = pin_alpha(GammaController(8, JUMP, flat(0.01)), 0.6)
    assert ctl.choose(8) == 0
    prior = LookupPrior(LOOKUP_KINDS)
    plain = [5, 6, 7, 8, 9, 10, 11]  # no n-gram recurs: nothing is found
    repeating = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 5, 6]  # (5, 6) recurs: 8 tokens follow it, a match of 2

    def settled(committed: list[int], gamma: int | None = None, model_alpha: float = 0.6, **fields) -> bool:
        request = GenerationRequest(committed, 32, SamplingParams(), gamma=gamma, proposer="hybrid", **fields)
        generation = Generation(request, DraftPool([]), None, None, frozenset(), 64,
                                pin_alpha(copy.deepcopy(ctl), model_alpha), lookup_prior=prior)
        return generation._settled(8, 31, committed)

    assert settled(plain) and settled(repeating), "nothing found; an untried kind found, tried short"
    assert not settled(plain, model_alpha=0.98), "the draft model at α 0.98"
    for kind in LOOKUP_KINDS:
        prior.tried(kind)
    prior.absorb({("self", 2, False): AcceptanceEstimate(accepted=99, rejections=1)})
    assert not settled(repeating), "the kind it finds, at α 0.99, for 8 tokens"
    assert settled(plain), "that kind, where it finds nothing"
    prior.absorb({("self", 2, False): AcceptanceEstimate(accepted=1, rejections=9)})
    assert settled(repeating), "the kind it finds, at a low α"
    assert not settled(repeating, prediction=(1, 2, 3)) and not settled(plain, gamma=2)


def test_settled_rounds_skip_the_pricing_and_emit_what_target_only_does(stack):
    """Through the services: a hybrid generation whose controller can never speculate prices γ once, then neither
    γ, the overlap nor a lookup again, drafts nothing and emits target-only's tokens; on a profile where
    speculation pays it prices every round but the prompt's (target-only under adaptive γ, a fixed γ's drafts)
    and any it settles, drafts, and gathers the α that bounds a settled round only after a round of γ = 0. The
    prompt repeats itself, so lookups find matches all along. `never` prices a verify of S tokens at S⁶ steps, so no
    γ > 0 wins. Hops are priced at 0: on the tiny models a hop costs about half a step, a loaded host's more."""
    servicer = stack.orchestrator.servicer
    prompt = [7, 8, 9, 10, 11] * 6
    never = CostProfile(tuple(STEP * s ** 6 for s in range(1, 10)))

    def run(gamma: int | None, target: CostProfile,
            prediction: tuple[int, ...] = ()) -> tuple[list[int], list[RoundRecord], dict]:
        ctl = pin_alpha(GammaController(8, target, flat(0.01), probe_every=1024), 0.9)
        # Hops priced at 0 whatever is measured: with the suite and two busy loops on 2 cores they once made γ = 0 win
        # every round of the generation where speculation is to pay.
        ctl.rtt_draft, ctl.rtt_target = Ewma(0.0, 0.0), Ewma(0.0, 0.0)
        calls = {"choose": 0, "overlap_pays": 0, "priced": 0, "found_alphas": 0}
        request = GenerationRequest(prompt, 24, SamplingParams(), gamma=gamma, proposer="hybrid", overlap="auto",
                                    ignore_eos=True, prediction=prediction)
        generation = Generation(request, servicer.drafts, servicer.target, servicer.tokenizer, frozenset(),
                                servicer.max_context, ctl)
        for owner, name in ((ctl, "choose"), (ctl, "overlap_pays"), (generation.lookups, "priced"),
                            (generation.lookups, "found_alphas")):
            counted(owner, name, calls)
        calls["decisions"] = decided(ctl)
        chunks = list(generation.run())
        return [t for c in chunks for t in c.token_ids], [c.record for c in chunks], calls

    expected, _, _ = run(0, never)
    tokens, records, calls = run(None, never)
    assert tokens == expected and all(r.drafted == 0 for r in records)
    # The prompt's round is target-only unpriced; the next is priced once; every later one is settled.
    assert calls == {"choose": 1, "overlap_pays": 1, "priced": 1, "found_alphas": len(records) - 2,
                     "decisions": [0] + ["settled"] * (len(records) - 2)}, calls
    # Where speculation pays, every round is priced but a settled one (on the tiny models a loaded host's hops can
    # make γ = 0 win a round or two), and α is gathered for the bound only after a round that chose γ = 0.
    _, records, calls = run(None, flat())
    decisions = calls["decisions"]
    assert len(decisions) == len(records) - 1 and calls["choose"] == len(decisions) - decisions.count("settled")
    assert calls["found_alphas"] == sum(d in (0, "settled") for d in decisions[:-1]), calls
    assert calls["priced"] > 0 and any(isinstance(d, int) and d > 0 for d in decisions), calls
    assert records[0].drafted == 0 and any(r.drafted > 0 for r in records[1:]), "adaptive: drafts from round 2"
    _, records, _ = run(2, flat())
    assert records[0].drafted > 0, "a fixed γ drafts in the prompt's round too"
    predicted, records, _ = run(None, flat(), prediction=tuple(expected))
    assert predicted == expected and records[0].drafted > 0, "a client's prediction is followed from the first round"


def decided(ctl: GammaController) -> list:
    """What decided each round from now on, in order: `choose`'s γ, or "settled" (target-only, unpriced)."""
    decisions, choose, settled = [], ctl.choose, ctl.settled

    def choosing(*args, **kwargs):
        decisions.append(choose(*args, **kwargs))
        return decisions[-1]

    def settling(*args, **kwargs):
        done = settled(*args, **kwargs)
        if done:
            decisions.append("settled")
        return done

    ctl.choose, ctl.settled = choosing, settling
    return decisions


def counted(owner, name: str, calls: dict) -> None:
    """Count the calls of `owner.name` in `calls[name]`."""
    method = getattr(owner, name)

    def wrapper(*args, **kwargs):
        calls[name] += 1
        return method(*args, **kwargs)

    setattr(owner, name, wrapper)
