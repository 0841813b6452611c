"""How the sandbox starts the runner: `python -I -S -B DIR/runner/__main__.py PROTO_FD` for one
session, or `... --serve CTRL_FD` for a pre-warmed server (a trailing tag only marks `ps`)."""

import os
import sys

if __name__ == "__main__":
    # -I keeps the script's own directory off sys.path. The package's parent is on it only while
    # the runner imports itself (last, so the standard library always wins): the candidate later
    # sees the same sys.path as any `python -I -S` program.
    serving = sys.argv[1] == "--serve"
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        if serving:
            from runner.prewarmed import serve as main
        else:
            from runner.supervisor import supervise as main
    finally:
        del sys.path[-1]
    main(int(sys.argv[2] if serving else sys.argv[1]))
