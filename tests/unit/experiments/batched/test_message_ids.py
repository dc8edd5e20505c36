"""The batched Grid's message ids: uuid4's form, unique, drawn from no generator a run keeps."""

from __future__ import annotations

import os
import random
import uuid

from lips_flwr.experiments.batched.calls import new_message_id


def test_ids_have_uuid4s_form_are_unique_and_touch_neither_os_urandom_nor_random(monkeypatch):
    def no_urandom(size: int) -> bytes:
        raise AssertionError("os.urandom called (a system call in every client call)")

    monkeypatch.setattr(os, "urandom", no_urandom)
    state = random.getstate()
    ids = [new_message_id() for _ in range(10_000)]
    assert random.getstate() == state  # (a seeded run's generators keep their draws)
    assert len(set(ids)) == len(ids)
    for made in ids[:100]:
        parsed = uuid.UUID(made)
        assert str(parsed) == made and parsed.version == 4 and parsed.variant == uuid.RFC_4122
