"""A task states a prompt (user turn + system-turn text); the policy renders it."""

import torch

from credo.policy.base import render_plain
from credo.core.rollouts import Prompt
from credo.tasks.chat import reference_prompt


def test_plain_rendering_puts_the_system_part_first():
    assert render_plain("1+2\n") == "1+2\n"
    assert render_plain(Prompt(user="1+2\n", system="3")) == "3\n\n1+2\n"
    assert render_plain(Prompt(user="1+2\n")) == "1+2\n"


def test_tiny_policy_renders_a_structured_prompt_as_plain_text(policy):
    ids, mask = policy.encode_prompts([Prompt(user="1+2\n", system="3"), "3\n\n1+2\n"])
    assert torch.equal(ids[0], ids[1]) and torch.equal(mask[0], mask[1])


def test_free_form_reference_context_is_a_system_turn():
    prompt = reference_prompt("What is 2+2?", "2+2=4")
    assert prompt.user == "What is 2+2?" and prompt.system.endswith("2+2=4") and "\x00" not in prompt.system
