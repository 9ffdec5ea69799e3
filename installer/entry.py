"""The frozen executable's entry point: `Foresight` (the app), `Foresight --engine ...` (the engine
process), `Foresight --device-probe PATH` (one device probe, run in a child by app.devices.child)."""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()
    if sys.argv[1:2] == ["--device-probe"] and len(sys.argv) == 3:
        # before app.cli, which may load llama.cpp: a probe must stay as small as its driver call
        from app.devices.child import probe_main

        sys.exit(probe_main(sys.argv[2]))
    from app.cli.commands import main

    sys.exit(main())
