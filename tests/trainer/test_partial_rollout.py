"""Partial rollouts on a real separate ``hf`` engine (a threaded Ray actor, as the trainer starts it): new weights
arriving stop a greedy generation in flight; the tokens so far are kept with the log-probs of the weights that
sampled them, and what the engine then generates from them with the new weights is exactly what a fresh greedy
generation from that prefix on the new weights gives."""

from __future__ import annotations

import time

import pytest
import torch

from kuberl.trainer.experience.stream import Response, continued, split_responses

TINY = "tiny://llama?hidden=64&layers=2&heads=2&kv_heads=1&seed=1"
BUDGET = 1200
PROMPT = [5, 17, 42, 8, 11]
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": BUDGET, "stop": ()}


def engine(partial_rollouts: bool):
    import ray

    from kuberl.trainer.rollout.hf import HFEngineActor

    actor = (
        ray.remote(HFEngineActor)
        .options(num_cpus=1, **HFEngineActor.ACTOR_OPTIONS)
        .remote(
            TINY,
            pad_id=0,
            eos_ids=[3],
            seed=0,
            threads=1,
            calculate_log_probs=True,
            max_batch_size=8,
            partial_rollouts=partial_rollouts,
        )
    )
    ray.get(actor.ready.remote())
    return actor


def generate(actor, prompt: list[int], max_new_tokens: int = BUDGET) -> Response:
    import ray

    rows = ray.get(actor.generate.remote([prompt], 1, {**GREEDY, "max_new_tokens": max_new_tokens}))
    return split_responses(rows)[0]


@pytest.mark.timeout(300)
def test_a_stopped_greedy_response_continues_as_a_fresh_generation_on_the_new_weights(local_ray):
    import ray

    from kuberl.trainer.model.loading import load_causal_lm

    old = load_causal_lm(TINY, torch.float32).state_dict()
    generator = torch.Generator().manual_seed(7)
    new = {name: t + 0.05 * torch.randn(t.shape, generator=generator) for name, t in old.items()}

    reference = engine(partial_rollouts=False)
    whole_old = generate(reference, PROMPT)
    assert len(whole_old.tokens) == BUDGET and whole_old.finished  # no eos: the budget ends it

    stoppable = engine(partial_rollouts=True)
    call = stoppable.generate.remote([PROMPT], 1, GREEDY)
    time.sleep(0.3)
    ray.get(stoppable.load_weights.remote(ray.put(new), 1))  # stops the generation, then loads
    (stopped,) = split_responses(ray.get(call))
    cut = len(stopped.tokens)
    assert not stopped.finished and 0 < cut < BUDGET, f"stopped after {cut} of {BUDGET} tokens"
    assert stopped.version == 0
    # what was kept is the old weights' greedy response so far, with their log-probs
    assert stopped.tokens == whole_old.tokens[:cut]
    assert stopped.log_probs == pytest.approx(whole_old.log_probs[:cut], abs=1e-5)

    continuation = generate(stoppable, PROMPT + stopped.tokens, BUDGET - cut)
    assert continuation.version == 1
    grown = continued(stopped, continuation, BUDGET)

    ray.get(reference.load_weights.remote(ray.put(new), 1))
    fresh = generate(reference, PROMPT + stopped.tokens, BUDGET - cut)
    assert grown.tokens[cut:] == fresh.tokens
    assert grown.log_probs[cut:] == pytest.approx(fresh.log_probs, abs=1e-5)
    assert grown.log_probs[:cut] == pytest.approx(whole_old.log_probs[:cut], abs=1e-5)
    assert len(grown.tokens) == BUDGET and grown.finished and grown.interrupted
    assert grown.version == 0  # its staleness counts from the first token
    # the new weights did change the rest: the old weights would have gone on otherwise
    assert fresh.tokens != whole_old.tokens[cut:]


def test_a_continuation_is_cut_to_the_response_budget_and_keeps_each_tokens_log_prob():
    stopped = Response(tokens=[7, 8], log_probs=[-0.1, -0.2], version=3, finished=False)
    more = Response(tokens=[9, 10, 11], log_probs=[-0.3, -0.4, -0.5], version=4, finished=False)
    grown = continued(stopped, more, 4)
    assert grown == Response([7, 8, 9, 10], [-0.1, -0.2, -0.3, -0.4], version=3, finished=True, interrupted=True)
    short = continued(stopped, Response([9], [-0.3], version=4, finished=False), 4)
    assert short.tokens == [7, 8, 9] and not short.finished  # stopped again: it continues once more
    ended = continued(stopped, Response([3], [-0.6], version=4, finished=True), 4)
    assert ended.finished and ended.tokens == [7, 8, 3]
