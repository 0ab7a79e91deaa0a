"""A session's checkpoints as decisions (SPEC B1, B2, B5, B7): no layers, no I/O —
``History`` says which checkpoints exist, which a rewind forgets, which two the bound
merges and what that does to the overlays' marks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolpool.pool.history import SKIPPED_KEPT, History, Merge, UnknownCheckpoint


def test_B1_the_start_is_the_first_checkpoint_and_each_turn_adds_one() -> None:
    # Given a session's history
    history = History({"w": 0}, now=100.0, limit=50)
    # When two turns end
    first = history.add({"w": 1}, 101.0, "t1", None)
    second = history.add({"w": 1, "root": 1}, 102.0, "t2", "installed")
    # Then they follow the start, oldest first, with what they are
    start = history.items[0]
    assert (start.turn_id, start.label, dict(start.depths)) == (None, "start", {"w": 0})
    assert [c.id for c in history.items] == [start.id, first.id, second.id]
    assert (second.turn_id, second.label, second.depth("root"), first.depth("root")) == (
        "t2",
        "installed",
        1,
        0,  # an overlay made since counts 0
    )


@pytest.mark.spec("B1")
def test_B1_a_turn_skipped_is_said_with_its_shells_and_the_list_stays_bounded() -> None:
    history = History({}, now=1.0, limit=50)
    skipped = history.skip("t1", 2.0, ("ab12", "cd34"))
    assert history.skipped == [skipped] and skipped.shells == ("ab12", "cd34")
    assert len(history) == 1  # no checkpoint was made
    # A dev server that runs for a thousand turns: the latest are said, no more
    for n in range(1000):
        history.skip(f"t{n}", 3.0, ("ab12",))
    assert len(history.skipped) == SKIPPED_KEPT and history.skipped[-1].turn_id == "t999"


@pytest.mark.spec("B2")
def test_B2_a_rewind_forgets_the_checkpoints_after_its_target() -> None:
    history = History({"w": 0}, now=1.0, limit=50)
    a = history.add({"w": 1}, 2.0, "t1", None)
    b = history.add({"w": 2}, 3.0, "t2", None)
    c = history.add({"w": 3}, 4.0, "t3", None)
    target, forgotten = history.rewind(a.id)
    assert target == a and forgotten == [b, c]
    assert history.latest == a
    with pytest.raises(UnknownCheckpoint):
        history.find(c.id)  # forgotten: a rewind there is refused


@pytest.mark.spec("B7")
def test_B7_ids_are_random_and_unknown_ones_are_refused_naming_the_known() -> None:
    one, other = History({}, now=1.0, limit=50), History({}, now=1.0, limit=50)
    made = [one.add({}, 2.0, f"t{i}", None) for i in range(100)]
    ids = {c.id for c in made} | {other.items[0].id}
    assert len(ids) == 101 and all(len(i) == len("cp-") + 16 for i in ids)  # 64 random bits
    # Another session's id, and a guessed one, are unknown here
    for foreign in (other.items[0].id, "cp-0000000000000000", "../../etc", ""):
        with pytest.raises(UnknownCheckpoint) as refused:
            one.find(foreign)
        assert made[-1].id in refused.value.message  # it names the latest it has


@pytest.mark.spec("B5")
def test_B5_past_the_bound_the_oldest_but_the_start_merges_into_the_next() -> None:
    # Given a bound of 3 and four checkpoints, each turn having frozen a layer
    history = History({"w": 0}, now=1.0, limit=3)
    a = history.add({"w": 1}, 2.0, "t1", None)
    b = history.add({"w": 2, "root": 1}, 3.0, "t2", None)
    assert history.merge_due() is None
    c = history.add({"w": 3, "root": 1}, 4.0, "t3", None)
    # When the bound is passed
    merge = history.merge_due()
    # Then the oldest after the start goes into the next: its layer of "w" and the
    # next one's are squashed (root had no layer in a: nothing to squash there)
    assert merge == Merge(a.id, b.id, (("w", 0),))
    history.merged(merge)
    assert [i.id for i in history.items] == [history.items[0].id, b.id, c.id]
    survivor, latest = history.items[1], history.items[2]
    assert survivor.merged == (a.id,)
    # Every later mark counts one layer less where two became one
    assert dict(survivor.depths) == {"w": 1, "root": 1}
    assert dict(latest.depths) == {"w": 2, "root": 1}
    assert history.merge_due() is None


@pytest.mark.spec("B5")
@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(2, 6),
    turns=st.lists(st.frozensets(st.sampled_from(["w", "root", "root/usr"])), max_size=40),
)
def test_B5_the_bound_holds_and_each_overlay_stacks_no_more_layers_than_checkpoints(
    limit: int, turns: list[frozenset[str]]
) -> None:
    # A model of the layers: each turn freezes a layer in the overlays it changed; a
    # merge squashes two into one. The history's marks must index that model.
    history = History({}, now=0.0, limit=limit)
    layers: dict[str, list[set[str]]] = {}  # overlay → its layers, each the turns it holds
    for number, changed in enumerate(turns, 1):
        for name in changed:
            layers.setdefault(name, []).append({f"t{number}"})
        history.add({n: len(v) for n, v in layers.items()}, float(number), f"t{number}", None)
        while (merge := history.merge_due()) is not None:
            for name, first in merge.squash:
                stack = layers[name]
                stack[first : first + 2] = [stack[first] | stack[first + 1]]
            history.merged(merge)
        # Then: within the bound, every mark within its overlay's stack
        assert len(history) <= limit
        for item in history.items:
            for name, depth in item.depths.items():
                assert 0 <= depth <= len(layers[name])
        # each overlay stacks at most one layer per checkpoint after the start
        for stack in layers.values():
            assert len(stack) <= len(history) - 1 or not stack
        # and the latest checkpoint still stacks every turn's changes, merged or not
        latest = history.latest
        for name, stack in layers.items():
            held = set().union(*stack[: latest.depth(name)]) if stack else set()
            assert held == {f"t{i}" for i, c in enumerate(turns[:number], 1) if name in c}
    # merged ids are never lost: each id made is in the list, or merged into one there
    listed = {i.id for i in history.items} | {m for i in history.items for m in i.merged}
    assert len(listed) == len(turns) + 1


def test_a_bound_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        History({}, now=0.0, limit=1)
