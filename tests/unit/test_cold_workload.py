"""The cold workload's prompts and their assignment: each prompt once in a server's life."""

from __future__ import annotations

import pytest

from specdec.benchmark import cold, cold_prompts, heldout, prompts
from specdec.benchmark.tiny_llama import make_tokenizer


def test_each_repeat_sends_disjoint_prompts_per_level_and_repeats_use_new_ones_while_they_last():
    levels = [1, 16, 64]
    plan = cold.assign(240, levels, serial=8, repeats=3)
    for by_level in plan:
        assert {lv: len(ids) for lv, ids in by_level.items()} == {1: 8, 16: 16, 64: 64}
        sent = [i for ids in by_level.values() for i in ids]
        assert len(set(sent)) == len(sent) == 88  # no prompt twice in one server's life
    first, second, third = ({i for ids in r.values() for i in ids} for r in plan)
    assert not first & second  # 176 of 240: the second repeat meets none of the first's
    assert len(third - first - second) == 240 - 176  # the third uses up the rest, then wraps
    assert cold.assign(240, levels, 8, 3) == plan  # seeded
    with pytest.raises(ValueError, match="a repeat sends 88 cold prompts, the set has 80"):
        cold.assign(80, levels, 8, 1)


def test_the_cold_set_is_its_own_mixed_and_distinct():
    conversations = cold_prompts.conversations()
    assert len(conversations) >= 200
    kinds = {label.split(":")[0] for label, _ in conversations}
    assert kinds == {"question", "explain", "code", "list", "rewrite", "summarise", "chat"}
    assert len({messages for _, messages in conversations}) == len(conversations)
    assert all(messages[-1][0] == "user" for _, messages in conversations)
    assert any(len(messages) >= 3 for _, messages in conversations)  # multi-turn chats
    # None of the tuning, held-out or suite prompts is among them.
    known = [text for group in heldout.sets().values() for part in group.values() for _, text in part]
    known += [text for _, text in prompts.edit_prompts()]
    texts = {text for _, messages in conversations for _, text in messages}
    assert not any(k.strip() and k.strip() in t for k in known for t in texts)
    # The first slice of any length mixes the kinds: a level's few prompts are not all alike.
    assert len({label.split(":")[0] for label, _ in conversations[:7]}) == 7


def test_a_conversation_renders_through_the_chat_template_or_as_role_lines():
    tokenizer = make_tokenizer(add_bos=True)
    messages = (("user", "Hi?"), ("assistant", "Hello."), ("user", "Bye?"))
    plain = tokenizer.decode(cold.render(tokenizer, messages), skip_special_tokens=True)
    assert plain == "user: Hi?\nassistant: Hello.\nuser: Bye?\nassistant:"
    tokenizer.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    ids = cold.render(tokenizer, messages)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<user>Hi?<assistant>Hello.<user>Bye?<assistant>"
    assert cold.render(tokenizer, messages, max_tokens=5) == ids[-5:]
    pool = cold.pool(tokenizer)
    assert len(pool) == len(cold_prompts.conversations()) and len({tuple(p) for p in pool}) == len(pool)
