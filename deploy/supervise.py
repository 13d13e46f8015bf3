"""Keep one command running, as a process supervisor would: restart it when it exits on its own, stop when told.

    python deploy/supervise.py COMMAND [ARGS…]

The dev run (`deploy/dev.py run`) starts its Celery workers through this. honcho stops the whole stack when any
one process exits, and a worker does exit now and then — SIGKILLed, OOM-killed, or when the broker restarts
under a late-acked message (see the note on remote control in config/settings/services.py). Production has
its supervisor (compose `restart: unless-stopped`); this is the development stand-in.

Stopping (Ctrl-C: honcho sends SIGTERM to this process's group, then SIGKILL after 5 s). The command runs in a
process group of its own, so that signal reaches this process only, and from here the command's main process
only: a Celery worker then shuts down warm, its pool processes finishing the slice in hand. Had they been in the
signalled group they would have died at once, mid-step (Celery's WorkerLostError, a lease left to expire). A
command still running STOP_GRACE_SECONDS later is killed with its whole group, before honcho's SIGKILL would have
left it running alone.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

STOP_GRACE_SECONDS = 4.0  # under honcho's 5 s between its SIGTERM and its SIGKILL
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def stop_when_orphaned() -> None:
    """In the command, before it starts: the kernel sends it SIGTERM (a warm shutdown) if this supervisor dies.
    Outside honcho's process group, a worker whose supervisor was SIGKILLed would otherwise run on as an orphan,
    holding honcho's output pipe open, so Ctrl-C would never end the run."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != SUPERVISOR_PID:
        os._exit(1)  # the supervisor died before the prctl took effect: do not start at all


SUPERVISOR_PID = os.getpid()


def wait(child: subprocess.Popen, stop_requested) -> int:
    """The child's exit code; once a stop was requested, at most STOP_GRACE_SECONDS later (then its group is
    killed). Polls: a blocking wait would not see the stop request the signal handler records."""
    while True:
        try:
            return child.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            requested = stop_requested()
            if requested is not None and time.monotonic() - requested > STOP_GRACE_SECONDS:
                kill_group(child)


def kill_group(child: subprocess.Popen) -> None:
    """The command and everything it started (a worker's pool processes outlive a SIGKILLed main process)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # nothing left in the group


def main(command: list[str]) -> int:
    stop_requested_at: float | None = None
    child: subprocess.Popen | None = None

    def stop(signum, frame):
        nonlocal stop_requested_at
        if stop_requested_at is None:
            stop_requested_at = time.monotonic()
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while True:
        child = subprocess.Popen(command, process_group=0, preexec_fn=stop_when_orphaned)
        code = wait(child, lambda: stop_requested_at)
        kill_group(child)
        if stop_requested_at is not None:
            return code
        print(f"[supervise] {' '.join(command[:4])}… exited with {code}; restarting it in 1 s", flush=True)
        time.sleep(1)
        if stop_requested_at is not None:
            return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
