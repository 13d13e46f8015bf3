"""Plans: the ordered step names of a task, stored in chunks so a step costs the same at any index.

A plan is run-length encoded (["load", "classify" × 20, "publish"] → [["load", 1], ["classify", 20],
["publish", 1]]) and cut into chunks of PLAN_CHUNK_STEPS steps, one PlanChunk row each. A slice holds only the
chunk with its cursor; finding the name at an index walks at most one chunk's runs, and a new chunk is read
once per PLAN_CHUNK_STEPS steps. So neither the claim nor a step grows with the plan's length.
"""

from __future__ import annotations

PLAN_CHUNK_STEPS = 1024


def plan_encode(names: list[str]) -> list[list]:
    encoded: list[list] = []
    for name in names:
        if encoded and encoded[-1][0] == name:
            encoded[-1][1] += 1
        else:
            encoded.append([name, 1])
    return encoded


def plan_decode(steps: list[list]) -> list[str]:
    return [name for name, count in steps for _ in range(count)]


def plan_chunks(names: list[str], *, first_chunk: int = 0) -> list[dict]:
    """The PlanChunk rows of a plan: [{"chunk": 0, "steps": [["tick", 1024]]}, …]. ``first_chunk``: ``names``
    start at that chunk's first index (a re-plan stores its plan from the chunk holding the cursor on)."""
    return [{"chunk": first_chunk + start // PLAN_CHUNK_STEPS,
             "steps": plan_encode(names[start:start + PLAN_CHUNK_STEPS])}
            for start in range(0, len(names), PLAN_CHUNK_STEPS)]


def chunk_of(index: int) -> int:
    return index // PLAN_CHUNK_STEPS


def chunk_step_name(steps: list[list], index: int) -> str:
    """The name at plan ``index`` within its chunk's runs."""
    offset = index % PLAN_CHUNK_STEPS
    for name, count in steps:
        if offset < count:
            return name
        offset -= count
    raise IndexError(index)


def chunk_names(steps: list[list]) -> set[str]:
    return {name for name, _ in steps}
