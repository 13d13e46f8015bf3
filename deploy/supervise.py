"""Keep one command running, as a process supervisor would: restart it when it exits on its own, stop when told.

    python deploy/supervise.py COMMAND [ARGS…]

The dev run (`deploy/dev.py run`) starts its Celery workers through this. honcho stops the whole stack when any
one process exits, and a worker does exit now and then — SIGKILLed, OOM-killed, or when the broker restarts
under a late-acked message (see the note on remote control in config/settings/services.py). Production has
its supervisor (compose `restart: unless-stopped`); this is the development stand-in. SIGINT/SIGTERM (Ctrl-C,
honcho's stop) go to the command too and end the loop.
"""

import signal
import subprocess
import sys
import time


def main(command: list[str]) -> int:
    stopping = False
    child: subprocess.Popen | None = None

    def stop(signum, frame):
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while True:
        child = subprocess.Popen(command)
        code = child.wait()
        if stopping:
            return code
        print(f"[supervise] {' '.join(command[:4])}… exited with {code}; restarting it in 1 s", flush=True)
        time.sleep(1)
        if stopping:
            return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
