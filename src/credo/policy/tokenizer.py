"""Character-level tokenizer for the tiny policy: one token per character, plus PAD/BOS/EOS."""

from __future__ import annotations

import torch

PAD, BOS, EOS = 0, 1, 2
SPECIAL = ("<pad>", "<bos>", "<eos>")


class CharTokenizer:
    """Maps characters of a fixed alphabet to ids 3.. ; ids 0/1/2 are PAD/BOS/EOS.

    `banned_in_sampling` are characters the model learns only as teacher-forced markers (the
    early-answer probe marker, the reference-solution separator): the sampler never emits them,
    so teaching them in SFT cannot make the policy stop early on its own.
    """

    pad_id, bos_id, eos_id = PAD, BOS, EOS

    def __init__(self, alphabet: str, banned_in_sampling: str = "") -> None:
        if len(set(alphabet)) != len(alphabet):
            raise ValueError(f"tokenizer alphabet has repeated characters: {alphabet!r}")
        self.alphabet = alphabet
        self.char_to_id = {c: i + len(SPECIAL) for i, c in enumerate(alphabet)}
        self.id_to_char = {i: c for c, i in self.char_to_id.items()}
        self.banned_ids = [self.char_to_id[c] for c in banned_in_sampling] + [PAD, BOS]
        self.banned_in_sampling = banned_in_sampling

    @property
    def vocab_size(self) -> int:
        return len(SPECIAL) + len(self.alphabet)

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        try:
            ids = [self.char_to_id[c] for c in text]
        except KeyError as err:
            raise ValueError(f"character {err.args[0]!r} in {text!r} "
                             f"is not in the tokenizer alphabet {self.alphabet!r}") from None
        return ([BOS] if bos else []) + ids + ([EOS] if eos else [])

    def decode(self, ids: list[int] | torch.Tensor) -> str:
        """Text of `ids`, stopping at the first EOS and skipping PAD/BOS."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        out = []
        for i in ids:
            if i == EOS:
                break
            if i in (PAD, BOS):
                continue
            out.append(self.id_to_char.get(i, "?"))
        return "".join(out)

    def state(self) -> dict:
        return {"kind": "char", "alphabet": self.alphabet, "banned_in_sampling": self.banned_in_sampling}

    @classmethod
    def from_state(cls, state: dict) -> "CharTokenizer":
        return cls(state["alphabet"], state.get("banned_in_sampling", ""))
