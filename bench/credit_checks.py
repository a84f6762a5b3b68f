"""Cost of credo's credit sanity checks (credo.integrations.checks) and verl batch validation on a realistic
batch, measured in one run: 64 rows (8 prompts x 8 completions) x 512 response tokens, 128 prompt tokens,
response lengths uniform in 64..512, 0/1 rewards, GRPO credit, on the CPU.

Rows: the checks as the TRL adapter runs them; as verl's apply_credit runs them (plus its batch validation);
verl's registered credo_grpo estimator with and without checks; apply_credit(grpo) on the same batch (tiny
random Llama; GRPO scores nothing with the model, so this is the adapter's cheapest credit step: building
the rollouts, decoding, verifying) with and without checks. Best of `--repeats` calls after one warm-up,
the on/off calls alternating.

Usage: python bench/credit_checks.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from common import timed, write  # noqa: E402

from credo import credit as credit_registry  # noqa: E402
from credo.integrations import checks  # noqa: E402
from credo.integrations.verl import make_verl_estimator  # noqa: E402
from credo.integrations.verl_batch import check_batch  # noqa: E402
from credo.integrations.verl_credit import apply_credit, dataset_row  # noqa: E402
from credo.core.rollouts import Rollouts  # noqa: E402
from credo.tasks import make_task  # noqa: E402

PROMPTS, GROUP, P, R = 8, 8, 128, 512


def batch(vocab: int, pad: int) -> tuple[Rollouts, list]:
    """Rollouts[64] with left-padded prompts and right-padded responses of random lengths, and the rows' tasks."""
    g = torch.Generator().manual_seed(0)
    B = PROMPTS * GROUP
    group = torch.arange(B) // GROUP
    prompt_len = torch.randint(32, P + 1, (PROMPTS,), generator=g)[group]
    prompt_mask = torch.arange(P)[None, :] >= (P - prompt_len)[:, None]
    prompt_ids = torch.where(prompt_mask, torch.randint(3, vocab, (PROMPTS, P), generator=g)[group], pad)
    length = torch.randint(64, R + 1, (B,), generator=g)
    completion_mask = torch.arange(R)[None, :] < length[:, None]
    completion_ids = torch.where(completion_mask, torch.randint(3, vocab, (B, R), generator=g), pad)
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    task = make_task("gym:chain_sum")
    problems = [task.heldout_problems(PROMPTS)[k] for k in group.tolist()]
    r = Rollouts(prompt_ids, prompt_mask, completion_ids, completion_mask, group, rewards, torch.zeros(B, R),
                 rewards >= 1, problems, [""] * B)
    return r, problems


def to_dataproto(r: Rollouts, task, problems):  # noqa: ANN001, ANN201
    from verl import DataProto
    mask = r.completion_mask.long()
    scores = torch.zeros(mask.shape)
    scores[torch.arange(r.batch_size), mask.sum(1) - 1] = r.rewards
    tensors = {"prompts": r.prompt_ids, "responses": r.completion_ids, "response_mask": mask,
               "attention_mask": torch.cat([r.prompt_mask.long(), mask], 1), "token_level_scores": scores,
               "token_level_rewards": scores.clone()}
    uid = np.array([f"uid-{g}" for g in r.group.tolist()], dtype=object)
    extra = np.array([dataset_row(task, p)["extra_info"] for p in problems], dtype=object)
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid, "extra_info": extra})


def interleaved(fns: dict, repeats: int) -> dict[str, float]:
    """Best wall time of each function, the calls alternating (on a shared machine, load drifts between runs)."""
    best = {name: float("inf") for name in fns}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from test_hf import build_tokenizer, tiny_llama
    tokenizer = build_tokenizer()
    model = tiny_llama(tokenizer, max_positions=P + R).eval()
    task = make_task("gym:chain_sum")
    r, problems = batch(len(tokenizer), tokenizer.pad_token_id)
    credit = credit_registry.get("grpo")(r).advantages
    where = checks.Where(step=0, off="-")
    prompts = [p.prompt for p in problems]
    real, trainable = r.completion_mask, r.trainable_mask()

    def trl_checks() -> None:
        checks.check_rewards(r.rewards, where)
        checks.check_groups(r.group, prompts, where)
        checks.check_advantages(credit, real, trainable, where, credit_real=real, credit_trainable=trainable)
        checks.check_group_sums(credit, trainable, r.group, where)

    def verl_checks() -> None:
        keys = checks.string_keys([f"uid-{g}" for g in r.group.tolist()])
        checks.check_groups(r.group, torch.where(r.prompt_mask, r.prompt_ids, -1), where, global_keys=keys)
        checks.check_advantages(credit, real, trainable, where, credit_real=real, credit_trainable=trainable)
        checks.check_group_sums(credit, trainable, r.group, where)

    proto = to_dataproto(r, task, problems)
    scores, mask, uid = proto.batch["token_level_rewards"], proto.batch["response_mask"], proto.non_tensor_batch["uid"]
    with_checks, without = make_verl_estimator("grpo"), make_verl_estimator("grpo", checks=False)

    def credit_step(on: bool) -> None:
        apply_credit(to_dataproto(r, task, problems), "grpo", module=model, tokenizer=tokenizer, task=task, checks=on)

    t = {name: timed(fn, args.repeats) for name, fn in [
        ("trl_checks", trl_checks), ("verl_checks", verl_checks),
        ("verl_validation", lambda: check_batch(proto, vocab_size=len(tokenizer)))]}
    t.update(interleaved({"reward_only_on": lambda: with_checks(scores, mask, uid),
                          "reward_only_off": lambda: without(scores, mask, uid)}, args.repeats))
    t.update(interleaved({"apply_credit_on": lambda: credit_step(True), "apply_credit_off": lambda: credit_step(False)},
                         args.repeats))
    ms = {k: 1e3 * v for k, v in t.items()}
    rows = [
        {"what": "TRL adapter's checks", "ms": ms["trl_checks"], "relative": "-"},
        {"what": "verl apply_credit's checks", "ms": ms["verl_checks"], "relative": "-"},
        {"what": "verl batch validation (always on)", "ms": ms["verl_validation"], "relative": "-"},
        {"what": "credo_grpo estimator, checks off", "ms": ms["reward_only_off"], "relative": "1.00x"},
        {"what": "credo_grpo estimator, checks on", "ms": ms["reward_only_on"],
         "relative": f"{t['reward_only_on'] / t['reward_only_off']:.2f}x"},
        {"what": "apply_credit(grpo), checks off", "ms": ms["apply_credit_off"], "relative": "1.00x"},
        {"what": "apply_credit(grpo), checks on", "ms": ms["apply_credit_on"],
         "relative": f"{t['apply_credit_on'] / t['apply_credit_off']:.2f}x"},
    ]
    write("credit_checks", rows, notes=f"batch {PROMPTS * GROUP} x {R} (prompts {P}), best of {args.repeats}, "
                                       "1 CPU thread; the machine is shared, so small differences are noise.")


if __name__ == "__main__":
    main()
