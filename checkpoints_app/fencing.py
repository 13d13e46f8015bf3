"""The lease fence every worker write carries: (task, lease_owner, lease_epoch)."""

from dataclasses import dataclass
from uuid import UUID


class LeaseLost(Exception):
    """The task's lease is no longer ours (expired and reaped, or re-claimed): write nothing, stop."""


@dataclass(frozen=True)
class Fence:
    task_id: UUID
    owner: str
    epoch: int

    def params(self) -> dict:
        return {"task_id": self.task_id, "owner": self.owner, "epoch": self.epoch}
